//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// storeCheck reports the store --store selects: its driver, the database's version
// and the schema version beside this binary's, without creating or migrating anything. A DSN's
// password is never printed.
func storeCheck(value, stateDir string) check {
	c := check{Name: "store"}
	spec, err := config.ParseStore(value, stateDir)
	if err != nil {
		c.Detail, c.Fix = err.Error(), "pass --store sqlite://PATH or --store postgres://user:password@host/db"
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var in store.Info
	var want int64
	switch spec.Driver {
	case config.StorePostgres:
		in, err = postgres.Probe(ctx, spec.DSN)
		want = postgres.SchemaVersion()
	default:
		in, err = sqlite.Probe(ctx, spec.Path)
		want = sqlite.SchemaVersion()
		if errors.Is(err, fs.ErrNotExist) {
			c.OK, c.Detail = true, fmt.Sprintf("sqlite %s: not created yet (agentbox serve creates it, schema %d)", spec.Path, want)
			return c
		}
	}
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "check that the database is reachable and the DSN's user, password and database are right"
		return c
	}
	c.Detail = fmt.Sprintf("%s %s at %s, schema %d (this agentbox: %d)", in.Driver, in.Version, in.Location, in.Schema, want)
	switch {
	case in.Schema > want:
		c.Fix = "the database was migrated by a newer agentbox: upgrade this binary"
	case in.Schema < want:
		c.OK = true
		c.Detail += "; agentbox serve migrates it"
	default:
		c.OK = true
	}
	return c
}

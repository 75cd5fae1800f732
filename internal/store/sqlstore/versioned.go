package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
)

// versioned checks the result of an optimistic `UPDATE … WHERE … AND version = expected`: one
// row changed is success; none is notFound() when versionQuery (which selects the record's
// version with args) finds no row, else CONFLICT naming what (e.g. "run r-…") and the stored
// version, in details.version.
func versioned(ctx context.Context, tx *Tx, res sql.Result, what string, expected int64, notFound func() error, versionQuery string, args ...any) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("update: %w", err)
	}
	if n == 1 {
		return nil
	}
	var stored int64
	err = tx.QueryRowContext(ctx, versionQuery, args...).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return notFound()
	}
	if err != nil {
		return fmt.Errorf("read version: %w", err)
	}
	return errcode.New(errcode.Conflict, "%s changed concurrently: it is at version %d, this update expected %d; re-read it and retry",
		what, stored, expected).With("version", stored)
}

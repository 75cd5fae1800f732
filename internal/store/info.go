package store

import "context"

// Info describes a store: what `agentbox doctor` reports.
type Info struct {
	Driver   string `json:"driver"`   // "sqlite" or "postgres"
	Version  string `json:"version"`  // the database's version
	Schema   int64  `json:"schema"`   // the schema version (the newest migration applied)
	Location string `json:"location"` // the file, or the DSN without its password
}

// Describer is implemented by stores that can describe themselves.
type Describer interface {
	Info(ctx context.Context) (Info, error)
}

// Package sqlquery is the contract of execute_sql: read-only SQL over a fixed set of
// published views of the store (Views), with a row limit, a result-size bound and a query
// timeout. A store driver implements Querier and enforces the contract with the database itself
// (for SQLite: a separate read-only connection whose authorizer allows only SELECT and reads of
// the views' columns); the surfaces (MCP execute_sql, REST POST /v1/sql, CLI agentbox sql) only
// validate arguments with Check and render a Result. This package knows no database.
package sqlquery

import (
	"context"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Querier runs one read-only query over the published views. query is one SELECT (or WITH …
// SELECT) statement; maxRows is the row limit (0: DefaultMaxRows). Errors are *errcode.Error:
// INVALID_ARGUMENT for anything but a read of the views (naming what is allowed),
// COMMAND_TIMEOUT past Timeout, OUTPUT_LIMIT_EXCEEDED for one value over MaxValueBytes,
// UNSUPPORTED_OPERATION where the store cannot serve SQL.
type Querier interface {
	Query(ctx context.Context, query string, maxRows int) (Result, error)
}

// Bounds of one query.
const (
	// DefaultMaxRows is the row limit of a query that names none.
	DefaultMaxRows = 100
	// MaxMaxRows is the largest row limit a query may ask for.
	MaxMaxRows = 10000
	// MaxResultBytes bounds the JSON size of a result's rows: past it, the rows read so far
	// are returned with truncated true and truncated_by "max_bytes".
	MaxResultBytes = 4 << 20
	// MaxValueBytes bounds one string or blob a query may build (SQLite's length limit on the
	// connection): a larger one fails the query with OUTPUT_LIMIT_EXCEEDED.
	MaxValueBytes = 1 << 20
	// MaxQueryBytes bounds the query text.
	MaxQueryBytes = 64 << 10
	// Timeout is how long a query may run before it is interrupted (COMMAND_TIMEOUT).
	Timeout = 5 * time.Second
)

// Result is one query's answer. Rows hold JSON values: integers and reals as numbers, text as
// strings, NULL as null, blobs as base64 strings.
type Result struct {
	Columns []string `json:"columns"`
	Rows    [][]any  `json:"rows"`
	// RowCount is len(Rows).
	RowCount int `json:"row_count"`
	// Truncated says more rows were there than returned; TruncatedBy says which bound cut
	// them: "max_rows" or "max_bytes".
	Truncated   bool   `json:"truncated"`
	TruncatedBy string `json:"truncated_by,omitempty"`
	// ElapsedMS is how long the query ran, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
}

// Check validates a query's arguments before any store sees them and returns the row limit to
// use (maxRows, or DefaultMaxRows for 0).
func Check(query string, maxRows int) (int, error) {
	if strings.TrimSpace(query) == "" {
		return 0, errcode.New(errcode.InvalidArgument, "query: required: one SELECT statement over the views %s", ViewNames())
	}
	if len(query) > MaxQueryBytes {
		return 0, errcode.New(errcode.InvalidArgument, "query: %d bytes, at most %d", len(query), MaxQueryBytes)
	}
	if maxRows == 0 {
		maxRows = DefaultMaxRows
	}
	if maxRows < 1 || maxRows > MaxMaxRows {
		return 0, errcode.New(errcode.InvalidArgument, "max_rows: %d, must be between 1 and %d (default %d)", maxRows, MaxMaxRows, DefaultMaxRows)
	}
	return maxRows, nil
}

// Allowed is the sentence refusals end with: what execute_sql accepts.
func Allowed() string {
	return "execute_sql runs one read-only SELECT (or WITH … SELECT) statement over the views " + ViewNames() +
		" (docs/ARCHITECTURE.md, \"SQL views\"); writes, DDL, PRAGMA, ATTACH/DETACH, transactions, other tables and functions outside the allowed list are refused"
}

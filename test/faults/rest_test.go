package faults

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// The campaign speaks the REST API as raw HTTP with its own small reply types: the public JSON
// contract (docs/API.md), not the server's Go types, so it tests what clients see.

// apiError is an error reply ({"error": {"code", "message"}}) or a transport failure (code "").
type apiError struct {
	Status  int
	Code    string
	Message string
	Err     error // the transport's error: the server is down or the call was cut
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return "transport: " + e.Err.Error()
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// code is an error's API code, "transport" when the call never got an answer, "" for nil.
func code(err error) string {
	var ae *apiError
	if err == nil {
		return ""
	}
	if errors.As(err, &ae) {
		if ae.Err != nil {
			return "transport"
		}
		if ae.Code == "" {
			return fmt.Sprintf("http_%d", ae.Status)
		}
		return ae.Code
	}
	return "other"
}

// rest is a client of one server address (it changes when the server restarts).
type rest struct {
	base  string
	token string
	hc    *http.Client
}

func (r rest) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		if raw, ok := in.([]byte); ok {
			body = bytes.NewReader(raw)
		} else {
			b, err := json.Marshal(in)
			if err != nil {
				return err
			}
			body = bytes.NewReader(b)
		}
	}
	u := r.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	if in != nil {
		if _, ok := in.([]byte); ok {
			req.Header.Set("Content-Type", "application/octet-stream")
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return &apiError{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return &apiError{Status: resp.StatusCode, Err: err}
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		json.Unmarshal(b, &e)
		msg := e.Error.Message
		if msg == "" {
			msg = strings.TrimSpace(string(b))
		}
		return &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: msg}
	}
	switch o := out.(type) {
	case nil:
	case *[]byte:
		*o = b
	default:
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: reply %q: %w", method, path, b, err)
		}
	}
	return nil
}

// sandboxReply is the part of a sandbox record the campaign reads.
type sandboxReply struct {
	ID     string            `json:"sandbox_id"`
	State  string            `json:"state"`
	Error  string            `json:"error"`
	Labels map[string]string `json:"labels"`
	Pool   string            `json:"pool"`
}

type execReply struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

type jobReply struct {
	ID      string `json:"job_id"`
	State   string `json:"state"`
	Signal  string `json:"signal"`
	Message string `json:"message"`
}

type logsReply struct {
	Data       string `json:"data"`
	TotalBytes int64  `json:"total_bytes"`
}

func (l logsReply) bytes() string {
	b, _ := base64.StdEncoding.DecodeString(l.Data)
	return string(b)
}

type runReply struct {
	ID     string `json:"run_id"`
	State  string `json:"state"`
	Reason string `json:"reason"`
}

type runEvent struct {
	Seq int64  `json:"seq"`
	To  string `json:"to"`
}

type approvalReply struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Tool      string `json:"tool"`
	SandboxID string `json:"sandbox_id"`
}

type capacityReply struct {
	MaxSandboxes int     `json:"max_sandboxes"`
	Live         int     `json:"live"`
	CPUUsed      float64 `json:"cpu_used"`
	MemoryUsedMB int64   `json:"memory_used_mb"`
	DiskUsedMB   int64   `json:"disk_used_mb"`
	Sleeping     int     `json:"sleeping"`
}

type sqlReply struct {
	Columns   []string `json:"columns"`
	Rows      [][]any  `json:"rows"`
	Truncated bool     `json:"truncated"`
}

// query runs read-only SQL over the store's views (POST /v1/sql) and returns rows as maps.
func (r rest) query(ctx context.Context, q string) ([]map[string]any, error) {
	var out sqlReply
	if err := r.do(ctx, "POST", "/v1/sql", nil, map[string]any{"query": q, "max_rows": 10000}, &out); err != nil {
		return nil, err
	}
	if out.Truncated {
		return nil, fmt.Errorf("sql %q: truncated", q)
	}
	rows := make([]map[string]any, 0, len(out.Rows))
	for _, row := range out.Rows {
		m := map[string]any{}
		for i, c := range out.Columns {
			if i < len(row) {
				m[c] = row[i]
			}
		}
		rows = append(rows, m)
	}
	return rows, nil
}

func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case json.Number:
		f, _ := x.Float64()
		return f
	case string:
		var f float64
		fmt.Sscan(x, &f)
		return f
	}
	return 0
}

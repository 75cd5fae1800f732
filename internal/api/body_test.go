package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// counted is a JSON body of n bytes ('{' then spaces) that counts what was read of it.
type counted struct {
	n, read int64
	got     atomic.Int64
}

func (c *counted) Read(p []byte) (int, error) {
	if c.read >= c.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), c.n-c.read)]
	for i := range p {
		p[i] = ' '
	}
	if c.read == 0 && len(p) > 0 {
		p[0] = '{'
	}
	c.read += int64(len(p))
	c.got.Store(c.read)
	return len(p), nil
}

// TestJSONBodyOverTheBound: a 1 GiB JSON body is refused with 413 FILE_TOO_LARGE naming the
// bound, with its length declared (refused before it is read) or chunked (refused once the bound
// is passed), on a plain route and through the gate (which reads the body to record it); the
// server never reads the whole body.
func TestJSONBodyOverTheBound(t *testing.T) {
	const gib = 1 << 30
	for _, gated := range []bool{false, true} {
		opts := api.Options{Token: "s3cret"}
		if gated {
			opts.Gate = gate.Chain{&gateLog{}}
		}
		srv := httptest.NewServer(api.New(nil, opts))
		t.Cleanup(srv.Close)
		for _, chunked := range []bool{false, true} {
			name := fmt.Sprintf("gated=%v chunked=%v", gated, chunked)
			body := &counted{n: gib}
			var rd io.Reader = body
			if chunked {
				rd = io.MultiReader(body) // no length known: sent chunked
			}
			req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes", rd)
			if !chunked {
				req.ContentLength = gib
			}
			req.Header.Set("Authorization", "Bearer s3cret")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s: %v (after %d bytes sent)", name, err, body.got.Load())
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb struct {
				Error struct {
					Code    errcode.Code
					Message string
					Details map[string]any
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &eb)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || eb.Error.Code != errcode.FileTooLarge ||
				!strings.Contains(eb.Error.Message, fmt.Sprint(api.MaxJSONBody)) || eb.Error.Details["limit"] != float64(api.MaxJSONBody) {
				t.Errorf("%s: %d %s; want 413 FILE_TOO_LARGE naming %d", name, resp.StatusCode, b, api.MaxJSONBody)
			}
			// What the client got to send is what the server read plus the sockets' buffers.
			if sent := body.got.Load(); sent > 4*api.MaxJSONBody {
				t.Errorf("%s: %d bytes of the body were sent before the refusal; the server read on", name, sent)
			}
		}
	}
}

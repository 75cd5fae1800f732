// Package modelfake is a scripted OpenAI-compatible chat-completions server for tests: it
// speaks the real wire format (POST /v1/chat/completions, JSON or server-sent events when the
// request says "stream": true, the same error bodies), and answers each request with the next
// reply of its script: text, tool calls (several at once), a malformed body, an HTTP error
// with Retry-After, or a stream dropped half way. Every request is recorded for the test to
// read back. No model runs: the tests check the client code against the format itself.
package modelfake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// ToolCall is one function call a reply asks for.
type ToolCall struct {
	ID   string // "" = "call_<n>"
	Name string
	Args string // JSON text of the arguments, sent as is (it may be malformed on purpose)
}

// Reply is one scripted answer.
type Reply struct {
	// Content is the assistant's text; ToolCalls the calls it asks for (with Content, or not).
	Content   string
	ToolCalls []ToolCall
	// Status, when not 0 or 200, answers with that HTTP status and an OpenAI error body of
	// Message (and ErrorCode, e.g. "invalid_api_key"); RetryAfter sets the Retry-After header.
	Status     int
	Message    string
	ErrorCode  string
	RetryAfter string
	// Raw, when set, is sent verbatim as a 200 body (JSON mode) or as one data: line (SSE).
	Raw string
	// DropAfter, when > 0 on a streamed reply, closes the connection after that many chunks
	// with no [DONE].
	DropAfter int
	// Delay is waited before answering (or Hold is waited on, whichever is set); a request
	// whose client goes away meanwhile is recorded as Canceled.
	Delay time.Duration
	Hold  <-chan struct{}
	// PromptTokens and CompletionTokens are reported in usage (0: derived from the lengths).
	PromptTokens, CompletionTokens int
	// FinishReason overrides "stop" / "tool_calls".
	FinishReason string
}

// Request is one request as the server received it.
type Request struct {
	Authorization string
	Model         string
	Stream        bool
	MaxTokens     int
	Messages      []Message
	Tools         []string // function names offered
	ToolSchemas   map[string]json.RawMessage
	Body          []byte
	Canceled      bool
}

// Message is one message of a request's conversation.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls,omitempty"`
}

// Text is the message's content as text (a string, or the text parts of an array).
func (m Message) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// Server is a running scripted model server.
type Server struct {
	URL string // base URL, ending in /v1
	// Key, when set, is the only bearer token accepted (else 401 invalid_api_key).
	Key string

	srv     *httptest.Server
	mu      sync.Mutex
	script  []Reply
	respond func(Request) Reply
	reqs    []Request
	n       int
}

// New starts a server answering with script in order; after the script it answers with
// Respond when set, else a 500 ("script exhausted").
func New(script ...Reply) *Server {
	s := &Server{script: script}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL + "/v1"
	return s
}

// Respond sets the function answering requests once the script is used up.
func (s *Server) Respond(f func(Request) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = f
}

// Push appends replies to the script.
func (s *Server) Push(rs ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, rs...)
}

// Requests returns a copy of every request received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Close stops the server, ending open connections.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		writeError(w, http.StatusNotFound, "unknown path "+r.URL.Path, "not_found", "")
		return
	}
	body, _ := io.ReadAll(r.Body)
	req := Request{Authorization: r.Header.Get("Authorization"), Body: body}
	var wire struct {
		Model     string    `json:"model"`
		Stream    bool      `json:"stream"`
		MaxTokens int       `json:"max_tokens"`
		MaxCT     int       `json:"max_completion_tokens"`
		Messages  []Message `json:"messages"`
		Tools     []struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(body, &wire); err != nil {
		writeError(w, http.StatusBadRequest, "body is not JSON: "+err.Error(), "invalid_request_error", "")
		return
	}
	req.Model, req.Stream, req.Messages = wire.Model, wire.Stream, wire.Messages
	req.MaxTokens = max(wire.MaxTokens, wire.MaxCT)
	req.ToolSchemas = map[string]json.RawMessage{}
	for _, t := range wire.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
		req.ToolSchemas[t.Function.Name] = t.Function.Parameters
	}
	s.mu.Lock()
	idx := len(s.reqs)
	s.reqs = append(s.reqs, req)
	key := s.Key
	var rep Reply
	switch {
	case key != "" && req.Authorization != "Bearer "+key:
		rep = Reply{Status: http.StatusUnauthorized, Message: "Incorrect API key provided.", ErrorCode: "invalid_api_key"}
	case len(s.script) > 0:
		rep, s.script = s.script[0], s.script[1:]
	case s.respond != nil:
		f := s.respond
		s.mu.Unlock()
		rep = f(req)
		s.mu.Lock()
	default:
		rep = Reply{Status: http.StatusInternalServerError, Message: "modelfake: script exhausted"}
	}
	s.n++
	n := s.n
	s.mu.Unlock()

	if rep.Hold != nil || rep.Delay > 0 {
		var timer <-chan time.Time
		if rep.Delay > 0 {
			timer = time.After(rep.Delay)
		}
		select {
		case <-rep.Hold:
		case <-timer:
		case <-r.Context().Done():
			s.mu.Lock()
			s.reqs[idx].Canceled = true
			s.mu.Unlock()
			return
		}
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		if rep.RetryAfter != "" {
			w.Header().Set("Retry-After", rep.RetryAfter)
		}
		typ := "server_error"
		if rep.Status < 500 {
			typ = "invalid_request_error"
		}
		writeError(w, rep.Status, rep.Message, typ, rep.ErrorCode)
		return
	}
	id := fmt.Sprintf("chatcmpl-%d", n)
	for i := range rep.ToolCalls {
		if rep.ToolCalls[i].ID == "" {
			rep.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", n, i)
		}
	}
	finish := rep.FinishReason
	if finish == "" {
		finish = "stop"
		if len(rep.ToolCalls) > 0 {
			finish = "tool_calls"
		}
	}
	pt, ct := rep.PromptTokens, rep.CompletionTokens
	if pt == 0 {
		pt = len(body)/4 + 1
	}
	if ct == 0 {
		ct = len(rep.Content)/4 + 1
	}
	usage := map[string]int{"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if rep.Raw != "" {
			io.WriteString(w, rep.Raw)
			return
		}
		msg := map[string]any{"role": "assistant", "content": rep.Content}
		if rep.Content == "" && len(rep.ToolCalls) > 0 {
			msg["content"] = nil
		}
		if len(rep.ToolCalls) > 0 {
			var tcs []map[string]any
			for _, tc := range rep.ToolCalls {
				tcs = append(tcs, map[string]any{"id": tc.ID, "type": "function",
					"function": map[string]any{"name": tc.Name, "arguments": tc.Args}})
			}
			msg["tool_calls"] = tcs
		}
		json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "chat.completion", "created": time.Now().Unix(),
			"model": req.Model, "choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	sent := 0
	send := func(delta map[string]any, fin *string, u map[string]int) bool {
		if rep.DropAfter > 0 && sent >= rep.DropAfter {
			return false
		}
		chunk := map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Model}
		choices := []any{}
		if delta != nil {
			c := map[string]any{"index": 0, "delta": delta, "finish_reason": nil}
			if fin != nil {
				c["finish_reason"] = *fin
			}
			choices = append(choices, c)
		}
		chunk["choices"] = choices
		if u != nil {
			chunk["usage"] = u
		}
		var b bytes.Buffer
		b.WriteString("data: ")
		json.NewEncoder(&b).Encode(chunk)
		b.WriteString("\n")
		w.Write(b.Bytes())
		if fl != nil {
			fl.Flush()
		}
		sent++
		return true
	}
	drop := func() {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetLinger(0)
				}
				c.Close()
			}
		}
	}
	if rep.Raw != "" {
		fmt.Fprintf(w, "data: %s\n\n", rep.Raw)
		if fl != nil {
			fl.Flush()
		}
		return
	}
	if !send(map[string]any{"role": "assistant", "content": ""}, nil, nil) {
		drop()
		return
	}
	// The text in pieces of a few characters: the client sees it token by token.
	for rest := rep.Content; rest != ""; {
		k := min(len(rest), 4)
		for k < len(rest) && !isBoundary(rest, k) {
			k++
		}
		if !send(map[string]any{"content": rest[:k]}, nil, nil) {
			drop()
			return
		}
		rest = rest[k:]
	}
	for i, tc := range rep.ToolCalls {
		// The name first, then the arguments in two pieces, as real servers do.
		if !send(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": tc.ID, "type": "function",
			"function": map[string]any{"name": tc.Name, "arguments": ""}}}}, nil, nil) {
			drop()
			return
		}
		half := len(tc.Args) / 2
		for _, part := range []string{tc.Args[:half], tc.Args[half:]} {
			if !send(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": part}}}}, nil, nil) {
				drop()
				return
			}
		}
	}
	if !send(map[string]any{}, &finish, nil) || !send(nil, nil, usage) {
		drop()
		return
	}
	io.WriteString(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

// isBoundary reports whether s can be cut at byte k (not inside a UTF-8 sequence).
func isBoundary(s string, k int) bool { return k >= len(s) || s[k]&0xC0 != 0x80 }

func writeError(w http.ResponseWriter, status int, msg, typ, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	e := map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}
	if code != "" {
		e["code"] = code
	}
	json.NewEncoder(w).Encode(map[string]any{"error": e})
}

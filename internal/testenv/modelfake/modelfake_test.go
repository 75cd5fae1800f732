package modelfake

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func client(s *Server, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.URL), option.WithAPIKey(key), option.WithMaxRetries(2))
}

// The wire format as the OpenAI SDK reads it: a JSON reply with parallel tool calls, and the
// same reply streamed, accumulated chunk by chunk.
func TestWireFormat(t *testing.T) {
	calls := []ToolCall{{Name: "run_python", Args: `{"code":"print(1)"}`}, {Name: "execute_sql", Args: `{"sql":"select 1"}`}}
	s := New(Reply{Content: "two calls", ToolCalls: calls}, Reply{Content: "héllo wörld, streamed", ToolCalls: calls})
	defer s.Close()
	c := client(s, "k")
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	r, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Choices[0].Message; got.Content != "two calls" || len(got.ToolCalls) != 2 || got.ToolCalls[1].Function.Arguments != `{"sql":"select 1"}` {
		t.Fatalf("reply %+v", got)
	}
	st := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for st.Next() {
		acc.AddChunk(st.Current())
		chunks++
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	m := acc.Choices[0].Message
	if m.Content != "héllo wörld, streamed" || len(m.ToolCalls) != 2 || m.ToolCalls[0].Function.Arguments != `{"code":"print(1)"}` || chunks < 8 {
		t.Fatalf("streamed %+v in %d chunks", m, chunks)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Fatal("no usage in the stream")
	}
	if reqs := s.Requests(); len(reqs) != 2 || !reqs[1].Stream || reqs[0].Authorization != "Bearer k" {
		t.Fatalf("requests %+v", reqs)
	}
}

// A 429 with Retry-After is retried; a wrong key is a 401; a dropped stream is an error.
func TestErrors(t *testing.T) {
	s := New(Reply{Status: 429, RetryAfter: "0", Message: "slow down"}, Reply{Content: "ok"},
		Reply{Content: "a long answer cut short", DropAfter: 2})
	defer s.Close()
	s.Key = "right"
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	wrong, right := client(s, "wrong"), client(s, "right")
	if _, err := wrong.Chat.Completions.New(ctx, params); err == nil {
		t.Fatal("wrong key accepted")
	} else if var_ := (*openai.Error)(nil); !errors.As(err, &var_) || var_.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %v", err)
	}
	r, err := right.Chat.Completions.New(ctx, params)
	if err != nil || r.Choices[0].Message.Content != "ok" {
		t.Fatalf("after 429: %v %+v", err, r)
	}
	st := right.Chat.Completions.NewStreaming(ctx, params)
	for st.Next() {
	}
	if st.Err() == nil {
		t.Fatal("a dropped stream ended without an error")
	}
	if n := len(s.Requests()); n != 4 {
		t.Fatalf("%d requests, want 4 (401, 429, retry, stream)", n)
	}
}

package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/agentbox/agentbox/internal/wire"
)

// Error codes of the loop: what went wrong with the model's endpoint or the loop's bounds,
// each saying what to change.
const (
	// ModelAuthFailed: the endpoint refused the key (HTTP 401/403).
	ModelAuthFailed = "MODEL_AUTH_FAILED"
	// ModelNoTools: the model or endpoint does not take tools.
	ModelNoTools = "MODEL_NO_TOOLS"
	// ModelUnreachable: nothing answered at the base URL.
	ModelUnreachable = "MODEL_UNREACHABLE"
	// ModelRateLimited: still 429 after the retries.
	ModelRateLimited = "MODEL_RATE_LIMITED"
	// ModelBadReply: the endpoint's reply could not be read (malformed, or a dropped stream).
	ModelBadReply = "MODEL_BAD_REPLY"
	// ModelFailed: any other error reply of the endpoint (its status and message are given).
	ModelFailed = "MODEL_FAILED"
	// StepLimit: the model still asked for tools after MaxSteps model calls.
	StepLimit = "STEP_LIMIT"
	// TimeLimit: the question took longer than the wall-clock limit.
	TimeLimit = "TIME_LIMIT"
	// Canceled: the user interrupted the call (Ctrl-C); the conversation is kept.
	Canceled = "CANCELED"
)

// Error is the loop's typed error.
type Error struct {
	Code    string
	Message string
	Status  int // the endpoint's HTTP status, when it answered
	Err     error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }
func (e *Error) Unwrap() error { return e.Err }

// CodeOf returns err's Code ("" when it is not an *Error).
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Model is the endpoint settings of a conversation.
type Model struct {
	BaseURL string // e.g. https://api.openai.com/v1, http://127.0.0.1:8080/v1
	Name    string // the model
	// APIKey is sent as the bearer token; it is never recorded anywhere.
	APIKey     string
	HTTPClient *http.Client
	// Stream asks for server-sent events (tokens as they come); else one JSON reply.
	Stream bool
	// MaxRetries on 429, 5xx and connection errors, with backoff honouring Retry-After.
	MaxRetries int
	// MaxTokens bounds each reply (0: the endpoint's default).
	MaxTokens int
}

// modelClient calls one chat-completions endpoint.
type modelClient struct {
	m Model
	c openai.Client
}

func newModelClient(m Model) *modelClient {
	opts := []option.RequestOption{option.WithBaseURL(m.BaseURL), option.WithAPIKey(m.APIKey), option.WithMaxRetries(m.MaxRetries)}
	if m.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(m.HTTPClient))
	}
	return &modelClient{m: m, c: openai.NewClient(opts...)}
}

// reply is one model answer.
type reply struct {
	content          string
	calls            []wire.ChatToolCall
	promptTokens     int64
	completionTokens int64
	finish           string
}

// complete sends the conversation and the tools; tokens get the text as it streams.
func (mc *modelClient) complete(ctx context.Context, msgs []wire.ChatMessage, tools []openai.ChatCompletionToolUnionParam, tokens func(string)) (reply, error) {
	params := openai.ChatCompletionNewParams{Model: shared.ChatModel(mc.m.Name), Messages: toParams(msgs), Tools: tools}
	if mc.m.MaxTokens > 0 {
		params.MaxTokens = openai.Int(int64(mc.m.MaxTokens))
	}
	if !mc.m.Stream {
		r, err := mc.c.Chat.Completions.New(ctx, params)
		if err != nil {
			return reply{}, mc.classify(ctx, err)
		}
		if len(r.Choices) == 0 {
			return reply{}, &Error{Code: ModelBadReply, Message: "the endpoint's reply has no choices"}
		}
		msg := r.Choices[0].Message
		out := reply{content: msg.Content, promptTokens: r.Usage.PromptTokens, completionTokens: r.Usage.CompletionTokens, finish: r.Choices[0].FinishReason}
		for _, tc := range msg.ToolCalls {
			out.calls = append(out.calls, wire.ChatToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		if out.content != "" && tokens != nil {
			tokens(out.content)
		}
		return out, nil
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := mc.c.Chat.Completions.NewStreaming(ctx, params)
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	var text strings.Builder
	for st.Next() {
		ch := st.Current()
		acc.AddChunk(ch)
		for _, c := range ch.Choices {
			if c.Index == 0 && c.Delta.Content != "" {
				text.WriteString(c.Delta.Content)
				if tokens != nil {
					tokens(c.Delta.Content)
				}
			}
		}
	}
	if err := st.Err(); err != nil {
		out := reply{content: text.String()}
		return out, mc.classify(ctx, err)
	}
	if len(acc.Choices) == 0 {
		return reply{content: text.String()}, &Error{Code: ModelBadReply, Message: "the endpoint's stream ended with no choices (dropped before any content?)"}
	}
	msg := acc.Choices[0].Message
	out := reply{content: msg.Content, promptTokens: acc.Usage.PromptTokens, completionTokens: acc.Usage.CompletionTokens, finish: acc.Choices[0].FinishReason}
	for _, tc := range msg.ToolCalls {
		out.calls = append(out.calls, wire.ChatToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if out.finish == "" && len(out.calls) == 0 && out.content == "" {
		return out, &Error{Code: ModelBadReply, Message: "the endpoint's stream ended without a finish reason or any content (dropped?)"}
	}
	return out, nil
}

// classify turns the client's error into the loop's typed one.
func (mc *modelClient) classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxError(ctx, err)
	}
	var ae *openai.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		if msg == "" {
			msg = strings.TrimSpace(string(ae.DumpResponse(true)))
			if len(msg) > 300 {
				msg = msg[:300]
			}
		}
		switch {
		case ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden:
			return &Error{Code: ModelAuthFailed, Status: ae.StatusCode, Err: err,
				Message: fmt.Sprintf("%s refused the API key (HTTP %d: %s): set the right key in $OPENAI_API_KEY or name its variable with --api-key-env", mc.m.BaseURL, ae.StatusCode, msg)}
		case ae.StatusCode == http.StatusTooManyRequests:
			return &Error{Code: ModelRateLimited, Status: ae.StatusCode, Err: err,
				Message: fmt.Sprintf("%s is still rate-limiting after %d retries (%s): wait and resume the conversation", mc.m.BaseURL, mc.m.MaxRetries, msg)}
		case ae.StatusCode >= 400 && ae.StatusCode < 500 && mentionsTools(msg):
			return &Error{Code: ModelNoTools, Status: ae.StatusCode, Err: err,
				Message: fmt.Sprintf("model %q at %s does not take tools (HTTP %d: %s): choose a model with tool calling (function calling), or start its server with tools enabled", mc.m.Name, mc.m.BaseURL, ae.StatusCode, msg)}
		}
		return &Error{Code: ModelFailed, Status: ae.StatusCode, Err: err, Message: fmt.Sprintf("%s answered HTTP %d: %s", mc.m.BaseURL, ae.StatusCode, msg)}
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || (errors.As(err, &ne) && !ne.Timeout()) {
		if oe != nil && oe.Op == "dial" || strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "no such host") {
			return &Error{Code: ModelUnreachable, Err: err, Message: fmt.Sprintf("nothing answers at %s (%v): check --base-url and that the model server runs", mc.m.BaseURL, err)}
		}
	}
	var se *json.SyntaxError
	if errors.As(err, &se) || strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "invalid character") ||
		strings.Contains(err.Error(), "connection reset") || errors.Is(err, net.ErrClosed) {
		return &Error{Code: ModelBadReply, Err: err, Message: fmt.Sprintf("the reply of %s could not be read (%v): the conversation is kept; ask again or resume", mc.m.BaseURL, err)}
	}
	return &Error{Code: ModelBadReply, Err: err, Message: fmt.Sprintf("calling %s: %v", mc.m.BaseURL, err)}
}

func mentionsTools(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "tool") || strings.Contains(m, "function call")
}

// ctxError is the error of a call ended by its context: the user's interrupt, or the limit.
func ctxError(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errTimeLimit) {
		return &Error{Code: TimeLimit, Err: err, Message: "the question took longer than the wall-clock limit (--timeout); the conversation is kept: resume it to go on"}
	}
	return &Error{Code: Canceled, Err: err, Message: "interrupted; the conversation is kept"}
}

var errTimeLimit = errors.New("wall-clock limit")

// toParams converts the kept messages to the request's.
func toParams(msgs []wire.ChatMessage) []openai.ChatCompletionMessageParamUnion {
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(msgs))
	for _, m := range msgs {
		switch m.Role {
		case "system":
			out = append(out, openai.SystemMessage(m.Content))
		case "user":
			out = append(out, openai.UserMessage(m.Content))
		case "tool":
			out = append(out, openai.ToolMessage(m.Content, m.ToolCallID))
		case "assistant":
			a := openai.ChatCompletionAssistantMessageParam{}
			if m.Content != "" || len(m.ToolCalls) == 0 {
				a.Content.OfString = openai.String(m.Content)
			}
			for _, tc := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID: tc.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: tc.Arguments}}})
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		}
	}
	return out
}

// toolParam is one MCP tool as a function the model may call.
func toolParam(name, desc string, schema map[string]any) openai.ChatCompletionToolUnionParam {
	fd := shared.FunctionDefinitionParam{Name: name, Parameters: shared.FunctionParameters(schema)}
	if desc != "" {
		fd.Description = openai.String(desc)
	}
	return openai.ChatCompletionFunctionTool(fd)
}

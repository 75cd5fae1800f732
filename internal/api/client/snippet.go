package client

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/snippet"
)

// maxSnippetReply bounds a run_python reply: two streams at their largest, inline images
// (base64) and the rest.
const maxSnippetReply = 2*snippet.MaxOutputBytes + 2*snippet.MaxInlineTotalBytes + 8<<20

// maxMetricsBytes bounds one scrape of GET /metrics.
const maxMetricsBytes = 32 << 20

// RunSnippet calls POST /v1/run_python or /v1/run_shell.
func (c *Client) RunSnippet(ctx context.Context, lang snippet.Language, req snippet.Request) (snippet.Result, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return snippet.Result{}, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/run_"+string(lang), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return snippet.Result{}, err
	}
	defer resp.Body.Close()
	var res snippet.Result
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxSnippetReply)).Decode(&res); err != nil {
		return snippet.Result{}, errcode.Wrap(errcode.Internal, err, "decode the server's run_%s reply: %v", lang, err)
	}
	return res, nil
}

// GatherMetrics scrapes GET /metrics and parses the text format.
func (c *Client) GatherMetrics(ctx context.Context) ([]*dto.MetricFamily, error) {
	resp, err := c.doAccept(ctx, http.MethodGet, "/metrics", nil, nil, "", "text/plain")
	if err != nil {
		if errcode.Of(err) == errcode.InvalidArgument {
			return nil, errcode.New(errcode.UnsupportedOp, "the agentbox server does not serve /metrics")
		}
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "parse the server's /metrics: %v", err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

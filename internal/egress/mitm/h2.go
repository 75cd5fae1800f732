package mitm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// An upstream that negotiates HTTP/2 (ALPN h2, offered beside http/1.1 except for a request
// that asks to upgrade, which HTTP/2 cannot carry) is spoken to in HTTP/2 over the same
// verified TLS connection, through golang.org/x/net/http2's ClientConn: its requests one at a
// time, as the sandbox sends them over its HTTP/1.1 connection; the response goes to the
// sandbox in the interceptor's HTTP/1.1 framing like any other (relay.go).

// h2Transport makes the ClientConns (its settings only: it dials nothing).
var h2Transport = &http2.Transport{MaxHeaderListSize: MaxHeaderBytes}

// requestHopHeaders are a request's hop-by-hop fields, which HTTP/2 does not carry.
var requestHopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade"}

// doneBody is a request body that says when it has been read to its end.
type doneBody struct {
	r    io.ReadCloser
	done atomic.Bool
}

func (d *doneBody) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err == io.EOF {
		d.done.Store(true)
	}
	return n, err
}

func (d *doneBody) Close() error { return nil } // the session owns the sandbox's connection

// roundTripH2 sends req over the HTTP/2 connection and returns the response once its header
// came (1xx interim responses relayed to the sandbox). body, when not nil, says whether the
// request's body was read to its end (otherwise the sandbox's connection cannot carry another
// request: the rest of the body is still on it).
func (s *session) roundTripH2(ctx context.Context, cc *http2.ClientConn, req *http.Request, sc *scrubber) (*http.Response, *doneBody, error) {
	out := req.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme = "https"
	out.URL.Host = s.host
	if s.port != 443 {
		out.URL.Host = s.host + ":" + strconv.Itoa(s.port)
	}
	out.Close = false
	dropHop(out.Header)
	for _, k := range requestHopHeaders {
		out.Header.Del(k)
	}
	if te := out.Header.Get("Te"); te != "" {
		out.Header.Del("Te")
		if strings.Contains(strings.ToLower(te), "trailers") {
			out.Header.Set("Te", "trailers")
		}
	}
	var body *doneBody
	if req.Body != nil && req.Body != http.NoBody {
		body = &doneBody{r: req.Body}
		out.Body = body
	} else {
		out.Body = http.NoBody
	}
	out.TransferEncoding = nil
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		interim := &http.Response{StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Header: http.Header(h)}
		return s.writeInterim(req, interim, sc)
	}}
	out = out.WithContext(httptrace.WithClientTrace(ctx, trace))
	resp, err := cc.RoundTrip(out)
	if err != nil {
		return nil, nil, fmt.Errorf("HTTP/2 with %s: %w", s.host, err)
	}
	return resp, body, nil
}

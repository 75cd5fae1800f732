//go:build linux

package guest_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// TestImpostorJobs: the jobs calls read a hostile agent's replies within their bounds and
// check them against the call.
func TestImpostorJobs(t *testing.T) {
	const id = "job-0123456789ab"
	info := func(jid string) string {
		return fmt.Sprintf(`{"job_id":%q,"argv":["x"],"state":"running","started_at":"2025-01-01T00:00:00Z","log_bytes":0}`, jid)
	}
	ctx := ctxT(t, 30*time.Second)

	// An endless job list, an endless argv: oversized, the connection dropped.
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/jobs" {
			im.endless(w, 200, "application/json", `{"jobs":[`, []byte(info(id)+","))
			return
		}
		im.endless(w, 200, "application/json", `{"job_id":"`+id+`","argv":["`, []byte("aaaaaaaa"))
	})
	_, err := im.c.Jobs(ctx)
	wantCode(t, err, errcode.Internal, "more than 1000 jobs")
	_, err = im.c.Job(ctx, id)
	wantOversized(t, err)

	for name, tc := range map[string]struct {
		body string
		call func(c *guest.Client) error
		want string
	}{
		"another job's status": {info("job-ffffffffffff"), func(c *guest.Client) error { _, err := c.Job(ctx, id); return err }, "status of job"},
		"running with an end": {strings.Replace(info(id), `"log_bytes"`, `"exit_code":0,"finished_at":"2025-01-01T00:00:01Z","log_bytes"`, 1),
			func(c *guest.Client) error { _, err := c.WaitJob(ctx, id, time.Second); return err }, "running job with an end"},
		"unknown state": {strings.Replace(info(id), "running", "zombie", 1), func(c *guest.Client) error { _, err := c.Job(ctx, id); return err }, "unknown job state"},
		"more log than asked": {`{"data":"AAAAAAAA","offset":0,"next_offset":6,"total_bytes":6,"truncated":false}`,
			func(c *guest.Client) error { _, err := c.JobLogs(ctx, id, guest.JobLogsRequest{Max: 4}); return err }, "at most 4"},
		"a slice that does not add up": {`{"data":"AAAA","offset":0,"next_offset":9,"total_bytes":9,"truncated":false}`,
			func(c *guest.Client) error { _, err := c.JobLogs(ctx, id, guest.JobLogsRequest{}); return err }, "slice"},
		"a log of an unknown state": {`{"data":"","offset":0,"next_offset":0,"total_bytes":0,"truncated":false,"state":"zombie"}`,
			func(c *guest.Client) error {
				_, err := c.JobLogs(ctx, id, guest.JobLogsRequest{Wait: time.Second})
				return err
			}, "unknown job state"},
		"a slice elsewhere": {`{"data":"AAAA","offset":5,"next_offset":8,"total_bytes":9,"truncated":false}`,
			func(c *guest.Client) error { _, err := c.JobLogs(ctx, id, guest.JobLogsRequest{Offset: 2}); return err }, "slice at 5"},
	} {
		im := startImpostor(t, fixed(200, "application/json", tc.body))
		err := tc.call(im.c)
		if errcode.Of(err) != errcode.Internal || !strings.Contains(errcode.Message(err), tc.want) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// JOB_LIMIT_EXCEEDED comes only from a start; JOB_NOT_FOUND from the others.
	im = startImpostor(t, fixed(429, "application/json", `{"code":"JOB_LIMIT_EXCEEDED","message":"full"}`))
	_, err = im.c.StartJob(ctx, guest.JobStartRequest{JobID: id, Argv: []string{"x"}})
	wantCode(t, err, errcode.JobLimitExceeded, "full")
	_, err = im.c.Job(ctx, id)
	wantCode(t, err, errcode.Internal, "unexpected error code")
	im = startImpostor(t, fixed(404, "application/json", `{"code":"JOB_NOT_FOUND","message":"gone"}`))
	_, err = im.c.CancelJob(ctx, id, 0)
	wantCode(t, err, errcode.JobNotFound, "gone")
	_, err = im.c.StartJob(ctx, guest.JobStartRequest{JobID: id, Argv: []string{"x"}})
	wantCode(t, err, errcode.Internal, "unexpected error code")
}

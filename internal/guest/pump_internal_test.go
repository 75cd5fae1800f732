package guest

import (
	"os"
	"testing"
	"time"
)

// TestPumpLateKeepsWhatThePipeHolds: a pump that runs only after the drain's deadline passed
// (a loaded machine schedules it late) still keeps what the command wrote before it ended,
// and returns without waiting for a writer that holds the pipe open (a background child).
func TestPumpLateKeepsWhatThePipeHolds(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // held open: a background child's copy
	if _, err := w.Write([]byte("1\n")); err != nil {
		t.Fatal(err)
	}
	var d drain
	d.start(r)
	if err := r.SetReadDeadline(time.Now().Add(-time.Second)); err != nil { // already passed
		t.Fatal(err)
	}
	c := &capture{max: 1 << 20}
	sink := make(chan Frame, 4)
	done := make(chan struct{})
	go func() { pump(r, "stdout", c, sink, &d); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("pump waited for the writer")
	}
	if string(c.kept) != "1\n" || c.total != 2 {
		t.Fatalf("kept %q (total %d), want the pipe's %q", c.kept, c.total, "1\n")
	}
	if f := <-sink; string(f.Data) != "1\n" || f.Stream != "stdout" {
		t.Fatalf("frame %+v", f)
	}
}

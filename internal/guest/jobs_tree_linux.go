package guest

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// signalTagged sends sig to every live process (but this one) that carries tag, started at or
// after since and descends from this process (as killTagged chooses them), and returns how many
// it signalled; sig 0 only counts them.
func signalTagged(tag uint32, since uint64, sig unix.Signal) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	want := []byte(strconv.FormatUint(uint64(tag), 10))
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !hasGroup(pid, want) {
			continue
		}
		state, start, _, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' || start < since || !descends(pid, self) {
			continue
		}
		if unix.Kill(pid, sig) == nil {
			n++
		}
	}
	return n
}

package guest

import "golang.org/x/sys/unix"

// waitAllFlag makes wait4 collect clone children too (whatever their exit signal).
const waitAllFlag = unix.WALL

func setSubreaper() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }

package guest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// LookupUser finds name in the sandbox's /etc/passwd.
func LookupUser(name string) (User, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return User{}, fmt.Errorf("guest: look up user %s: %w", name, err)
	}
	defer f.Close()
	return lookupUserIn(f, name)
}

// lookupUserIn finds name in passwd(5) data: name:password:uid:gid:gecos:home:shell.
func lookupUserIn(r io.Reader, name string) (User, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return User{}, fmt.Errorf("guest: user %s has a malformed passwd entry", name)
		}
		return User{Name: name, UID: uint32(uid), GID: uint32(gid), Home: f[5]}, nil
	}
	if err := sc.Err(); err != nil {
		return User{}, fmt.Errorf("guest: look up user %s: %w", name, err)
	}
	return User{}, fmt.Errorf("guest: user %s is not in /etc/passwd", name)
}

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

// ParseUser resolves an image's user as Docker writes it: a name in /etc/passwd, a uid, or
// either followed by ":group" (a gid, or a name in /etc/group). A uid not in /etc/passwd is a
// user of that uid and gid, named by the number, whose home is "/".
func ParseUser(spec string) (User, error) {
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	return parseUser(spec, string(passwd), string(group))
}

// maxUserID bounds ids an image may name (a sandbox maps 0..65535).
const maxUserID = 65535

func parseUser(spec, passwd, group string) (User, error) {
	name, grp, hasGroup := strings.Cut(spec, ":")
	if name == "" || (hasGroup && grp == "") {
		return User{}, fmt.Errorf("guest: user %q must be NAME, UID, NAME:GROUP or UID:GID", spec)
	}
	var u User
	if uid, err := strconv.ParseUint(name, 10, 32); err == nil {
		if uid > maxUserID {
			return User{}, fmt.Errorf("guest: user %q: uid %d is above %d", spec, uid, maxUserID)
		}
		u = User{Name: name, UID: uint32(uid), GID: uint32(uid), Home: "/"}
		sc := bufio.NewScanner(strings.NewReader(passwd))
		for sc.Scan() {
			f := strings.Split(sc.Text(), ":")
			if len(f) >= 7 && f[2] == name {
				if g, err := strconv.ParseUint(f[3], 10, 32); err == nil {
					u = User{Name: f[0], UID: uint32(uid), GID: uint32(g), Home: f[5]}
				}
				break
			}
		}
	} else {
		var err error
		if u, err = lookupUserIn(strings.NewReader(passwd), name); err != nil {
			return User{}, err
		}
	}
	if !hasGroup {
		return u, nil
	}
	if gid, err := strconv.ParseUint(grp, 10, 32); err == nil {
		if gid > maxUserID {
			return User{}, fmt.Errorf("guest: user %q: gid %d is above %d", spec, gid, maxUserID)
		}
		u.GID = uint32(gid)
		return u, nil
	}
	sc := bufio.NewScanner(strings.NewReader(group))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 3 && f[0] == grp {
			gid, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				break
			}
			u.GID = uint32(gid)
			return u, nil
		}
	}
	return User{}, fmt.Errorf("guest: group %s of user %q is not in /etc/group", grp, spec)
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

//go:build unix

package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// unprivilegedOwner returns what makes a command run as a user postgres
// accepts. Postgres refuses to run as root, so when this process is root
// it hands dir to the OS user postgres (or nobody) and the returned func
// makes commands run as that user; otherwise commands run as this process.
func unprivilegedOwner(dir string) (func(*exec.Cmd), error) {
	if os.Geteuid() != 0 {
		return func(*exec.Cmd) {}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		return nil, fmt.Errorf("testenv: Postgres cannot run as root and there is no postgres or nobody user to run it as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return nil, fmt.Errorf("testenv: hand the private Postgres directory to user %s: %w", u.Username, err)
	}
	return func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}, nil
}

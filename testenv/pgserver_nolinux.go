//go:build !linux

package testenv

import "os/exec"

// dieWithParent does nothing: only Linux stops a child when its parent
// dies, and elsewhere Stop is the only way.
func dieWithParent(*exec.Cmd) {}

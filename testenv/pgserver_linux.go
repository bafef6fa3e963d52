package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel stop postgres (SIGQUIT, an immediate
// shutdown) when the process that started it dies without calling Stop, a
// test binary killed at its -timeout for one, instead of leaving it
// running. Its temporary directory stays behind then.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
}

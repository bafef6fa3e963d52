//go:build unix

package relay_test

import (
	"os"
	"syscall"
)

// stopSignal and contSignal pause and resume a relay process.
var stopSignal, contSignal os.Signal = syscall.SIGSTOP, syscall.SIGCONT

//go:build !unix

package relay_test

import "os"

// stopSignal and contSignal are nil where processes cannot be paused: the
// pause fault does nothing there.
var stopSignal, contSignal os.Signal

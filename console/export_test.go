package console

import "time"

// Rates in the tests need observations only a moment apart.
func init() { rateMinGap = 100 * time.Millisecond }

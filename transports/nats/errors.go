package nats

import "errors"

// ErrConfig is returned (wrapped) by the constructors for an invalid
// configuration.
var ErrConfig = errors.New("idemq/nats: invalid configuration")

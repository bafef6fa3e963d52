package idemq

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrConfig is matched (with errors.Is) by every error a constructor returns
// for an invalid configuration. The error itself is a [*ConfigError] that
// names the component and the field.
var ErrConfig = errors.New("invalid configuration")

// ConfigError reports one invalid configuration value.
type ConfigError struct {
	// Component is the package or type being configured ("relay", "kafka.Subscriber").
	Component string
	// Field is the path of the offending field ("Retry.BaseDelay").
	Field string
	// Reason says what is wrong and, where it can, how to fix it.
	Reason string
}

// NewConfigError returns a [*ConfigError]; format and args build its Reason.
func NewConfigError(component, field, format string, args ...any) error {
	return &ConfigError{Component: component, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s: invalid configuration: %s %s", e.Component, e.Field, e.Reason)
}

// Is makes every ConfigError match [ErrConfig].
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// Retry is the one retry policy of idemq: exponential backoff with full
// jitter, bounded by attempts and by time. Every component that retries
// (consumer, relay, transports, request and webhook clients) embeds it in its
// Config as the field Retry and exports its defaults as RetryDefault; a zero
// field takes the component's default.
type Retry struct {
	// MaxAttempts bounds the failed attempts before the work becomes a dead
	// letter. Only real failures count: a crash, a lost connection or a
	// cancelled context is not an attempt.
	MaxAttempts int
	// BaseDelay is the ceiling of the first retry's delay; each further
	// retry doubles the ceiling up to MaxDelay.
	BaseDelay time.Duration
	// MaxDelay caps the ceiling of every retry's delay.
	MaxDelay time.Duration
	// MaxElapsed bounds the time spent retrying one piece of work in place;
	// a component that keeps attempts durably (the relay) ignores it.
	MaxElapsed time.Duration
}

// WithDefaults returns r with every zero field taken from def.
func (r Retry) WithDefaults(def Retry) Retry {
	return Retry{
		MaxAttempts: cmp.Or(r.MaxAttempts, def.MaxAttempts),
		BaseDelay:   cmp.Or(r.BaseDelay, def.BaseDelay),
		MaxDelay:    cmp.Or(r.MaxDelay, def.MaxDelay),
		MaxElapsed:  cmp.Or(r.MaxElapsed, def.MaxElapsed),
	}
}

// Validate reports a negative field or a BaseDelay above MaxDelay as a
// [*ConfigError] of component, with fields named under "Retry.".
func (r Retry) Validate(component string) error {
	switch {
	case r.MaxAttempts < 0:
		return NewConfigError(component, "Retry.MaxAttempts", "%d is negative", r.MaxAttempts)
	case r.BaseDelay < 0:
		return NewConfigError(component, "Retry.BaseDelay", "%v is negative", r.BaseDelay)
	case r.MaxDelay < 0:
		return NewConfigError(component, "Retry.MaxDelay", "%v is negative", r.MaxDelay)
	case r.MaxElapsed < 0:
		return NewConfigError(component, "Retry.MaxElapsed", "%v is negative", r.MaxElapsed)
	case r.MaxDelay > 0 && r.BaseDelay > r.MaxDelay:
		return NewConfigError(component, "Retry.BaseDelay", "%v exceeds Retry.MaxDelay %v", r.BaseDelay, r.MaxDelay)
	}
	return nil
}

// Delay returns the wait before retry number attempt (1-based): a uniformly
// random duration in [0, min(MaxDelay, BaseDelay·2^(attempt-1))], which is
// full jitter. It is at least hint, a delay the failing party asked for
// (see [RetryAfter]), when hint is larger.
func (r Retry) Delay(attempt int, hint time.Duration) time.Duration {
	ceiling := r.BaseDelay
	for i := 1; i < attempt && ceiling < r.MaxDelay; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, r.MaxDelay)
	var d time.Duration
	if ceiling > 0 {
		d = rand.N(ceiling + 1)
	}
	return max(d, hint)
}

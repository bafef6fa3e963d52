package nats

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemq/idemq"
)

// minDuration is the least FetchWait, InProgressInterval and AckTimeout
// accepted. Zero means the default; a few nanoseconds would instead make
// every fetch expire before the server answers (a busy loop), report
// progress in a busy loop, or time every acknowledgement out.
const minDuration = time.Millisecond

// checkDuration refuses a duration of field that is negative, or positive
// but below minDuration; 0 (the default) passes.
func checkDuration(component, field string, d time.Duration) error {
	if d < 0 || (d > 0 && d < minDuration) {
		return idemq.NewConfigError(component, field, "%v is below the minimum of %v; leave it 0 for the default", d, minDuration)
	}
	return nil
}

// checkSubject refuses a subject the server would refuse: empty, with
// blanks, with an empty token; with wildcards, a '>' not last; without,
// any wildcard (a publish goes to one subject).
func checkSubject(component, field, subject string, wildcards bool) error {
	if subject == "" {
		return idemq.NewConfigError(component, field, "is empty")
	}
	if strings.ContainsAny(subject, " \t\r\n\f\v") {
		return idemq.NewConfigError(component, field, "%q holds a blank", subject)
	}
	tokens := strings.Split(subject, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			return idemq.NewConfigError(component, field, "%q has an empty token (a leading, trailing or doubled '.')", subject)
		case !wildcards && (tok == "*" || tok == ">"):
			return idemq.NewConfigError(component, field, "%q has a wildcard; messages are published to one subject", subject)
		case tok == ">" && i != len(tokens)-1:
			return idemq.NewConfigError(component, field, "%q has '>' before its last token", subject)
		}
	}
	return nil
}

// checkHeaderName refuses a header name no message can carry (blanks or a
// ':'); "" passes (the default).
func checkHeaderName(component, field, name string) error {
	if strings.ContainsAny(name, " \t\r\n:") {
		return idemq.NewConfigError(component, field, "%q is no header name (blanks or ':')", name)
	}
	return nil
}

// checkConn refuses a nil or closed connection.
func checkConn(component, field string, nc *nats.Conn) error {
	switch {
	case nc == nil:
		return idemq.NewConfigError(component, field, "is nil")
	case nc.IsClosed():
		return idemq.NewConfigError(component, field, "is closed; pass an open connection")
	}
	return nil
}

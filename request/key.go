package request

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
)

// ID names a request record: the client's key within a scope. The scope
// is the tenant or principal the key belongs to, so that one client's key
// can never replay another client's response (the draft's composite key).
type ID struct {
	Scope string
	Key   string
}

// MaxScopeLen bounds a scope, in bytes: it names a tenant or a principal.
const MaxScopeLen = 128

// KeyFormat is an optional shape a key must have.
type KeyFormat uint8

const (
	// AnyKey accepts any printable ASCII key within the length limit.
	AnyKey KeyFormat = iota
	// UUIDKey requires a UUID in its canonical 36-character form, any
	// version, either letter case.
	UUIDKey
	// ULIDKey requires a ULID: 26 characters of Crockford base32.
	ULIDKey
)

// KeyRules are the format limits of keys, published to clients by the
// front ends' documentation. The zero value is valid.
type KeyRules struct {
	// MaxLen bounds a key, in bytes. Defaults to 255 (Stripe's limit).
	MaxLen int
	// Format is the shape keys must have. Defaults to AnyKey.
	Format KeyFormat
}

// MaxKeyLenDefault is the default KeyRules.MaxLen.
const MaxKeyLenDefault = 255

// WithDefaults returns r with zero fields set to their defaults.
func (r KeyRules) WithDefaults() KeyRules {
	if r.MaxLen == 0 {
		r.MaxLen = MaxKeyLenDefault
	}
	return r
}

// Validate reports out-of-range rules as an idemq.ConfigError of component,
// with fields named under "Keys.".
func (r KeyRules) Validate(component string) error {
	switch {
	case r.MaxLen < 0:
		return idemq.NewConfigError(component, "Keys.MaxLen", "%d is negative", r.MaxLen)
	case r.MaxLen > 1024:
		return idemq.NewConfigError(component, "Keys.MaxLen", "%d is over 1024; a key is an identifier, not a payload", r.MaxLen)
	case r.Format > ULIDKey:
		return idemq.NewConfigError(component, "Keys.Format", "unknown format %d", r.Format)
	}
	return nil
}

// Check reports whether id's key obeys the rules (after WithDefaults), as
// an error wrapping [ErrInvalidKey], and whether its scope is acceptable,
// as an error wrapping [ErrMisconfigured]: the client chose the key, but
// the server derived the scope. Keys and scopes are printable ASCII (0x20
// to 0x7E), the characters an HTTP sf-string and gRPC metadata can carry.
func (r KeyRules) Check(id ID) error {
	r = r.WithDefaults()
	switch {
	case len(id.Scope) > MaxScopeLen:
		return fmt.Errorf("%w: the scope function returned %d bytes, over the limit of %d; return a tenant or principal id, or hash a longer one", ErrMisconfigured, len(id.Scope), MaxScopeLen)
	case !printable(id.Scope):
		return fmt.Errorf("%w: the scope function returned %q, which is not printable ASCII; return an ASCII id, or hash the name", ErrMisconfigured, id.Scope)
	case id.Key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(id.Key) > r.MaxLen:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrInvalidKey, len(id.Key), r.MaxLen)
	case !printable(id.Key):
		return fmt.Errorf("%w: only printable ASCII is allowed", ErrInvalidKey)
	}
	switch r.Format {
	case UUIDKey:
		if _, err := uuid.Parse(id.Key); err != nil || len(id.Key) != 36 {
			return fmt.Errorf("%w: want a UUID like 8e03978e-40d5-43e8-bc93-6894a57f9324", ErrInvalidKey)
		}
	case ULIDKey:
		if !isULID(id.Key) {
			return fmt.Errorf("%w: want a ULID like 01ARZ3NDEKTSV4RRFFQ69G5FAV", ErrInvalidKey)
		}
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// isULID reports whether s is 26 characters of Crockford base32 (no I, L,
// O, U; either case) whose first character keeps it within 128 bits.
func isULID(s string) bool {
	if len(s) != 26 || s[0] > '7' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20 // lower case; digits are unchanged
		switch {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z' && c != 'i' && c != 'l' && c != 'o' && c != 'u':
		default:
			return false
		}
	}
	return true
}

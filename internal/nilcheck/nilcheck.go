// Package nilcheck tells a nil interface value from a usable one, for the
// constructors that must refuse a typed nil (a (*pgstore.Store)(nil) passed
// as a request.Store) at construction instead of panicking on first use.
package nilcheck

import "reflect"

// IsNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, func or channel, which a plain v == nil misses.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

package request_test

import (
	"reflect"
	"testing"

	"github.com/idemq/idemq/request"
)

func TestResponseEncoding(t *testing.T) {
	for _, r := range []request.Response{
		{},
		{Status: 201, Body: []byte(`{"order":1}`)},
		{Status: 404, Header: map[string][]string{"Location": {"/a"}, "Link": {"<a>", "<b>"}, "Empty": {}}},
		{Status: 201, Header: map[string][]string{"Location": {"/reports/1"}}, Omitted: 5 << 20},
	} {
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got request.Response
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if len(r.Header) == 0 {
			r.Header = nil
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip of %+v gave %+v", r, got)
		}
	}
	if _, err := (request.Response{Status: -1}).MarshalBinary(); err == nil {
		t.Fatal("a negative status was encoded")
	}
}

// FuzzResponseDecoding: no stored bytes make the decoder panic or
// allocate without bound, and what decodes encodes to the same bytes'
// meaning.
func FuzzResponseDecoding(f *testing.F) {
	good, _ := request.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("x")}.MarshalBinary()
	f.Add(good)
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{1, 200, 1, 10})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r request.Response
		if r.UnmarshalBinary(b) != nil {
			return
		}
		again, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var r2 request.Response
		if err := r2.UnmarshalBinary(again); err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-encoding %+v: %+v, %v", r, r2, err)
		}
	})
}

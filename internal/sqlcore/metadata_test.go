package sqlcore

import (
	"encoding/json"
	"maps"
	"testing"
)

// FuzzDecodeMetadata: decodeMetadata reads any text as encoding/json reads
// it into a map of strings (the same map, or an error for the same texts),
// whether its fast path or encoding/json reads it.
func FuzzDecodeMetadata(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, ` { } `, `{"a":"b"}`, `{"a": "b", "c" : "d"}`, `{"a":"b","a":"c"}`,
		`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","name":"x"}`,
		`{"a":"\u003cb\u003e"}`, `{"a":"\"q\""}`, `{"a":"é€😀"}`, "{\"a\":\"\xff\"}", "{\"a\":\"\x01\"}",
		`{"a":1}`, `{"a":null}`, `null`, `{"a":"b",}`, `{"a":"b"`, `{"a" "b"}`, `{"a":"b"} x`, `["a"]`,
		"{\"a\":\"b\"}\n", `{"":""}`, `{"a":"b","c":"d","e":"f"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		got, err := decodeMetadata(text)
		want := map[string]string{}
		var wantErr error
		if text != "" {
			wantErr = json.Unmarshal([]byte(text), &want)
		}
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("decodeMetadata(%q): error %v, encoding/json's %v", text, err, wantErr)
		}
		if err == nil && !maps.Equal(got, want) {
			t.Fatalf("decodeMetadata(%q) = %q, encoding/json reads %q", text, got, want)
		}
	})
}

// TestDecodeMetadataReadsPlainObjectsDirectly: what encodeMetadata writes
// for metadata without characters to escape is read by the fast path,
// which allocates only the map.
func TestDecodeMetadataReadsPlainObjectsDirectly(t *testing.T) {
	md := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "name": "order placed"}
	text, err := encodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := decodePlainObject(text); !ok {
		t.Fatalf("%q: not read by the fast path", text)
	}
	allocs := testing.AllocsPerRun(100, func() {
		got, err := decodeMetadata(text)
		if err != nil || !maps.Equal(got, md) {
			t.Fatalf("decodeMetadata(%q) = %q, %v", text, got, err)
		}
	})
	if allocs > 2 {
		t.Errorf("decodeMetadata of two entries: %.0f allocations, want at most 2 (the map)", allocs)
	}
}

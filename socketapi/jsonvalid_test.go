package socketapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// validJSONCases are lines valid or not in the ways a validator can get
// wrong; json.Valid is the reference for each.
var validJSONCases = []string{
	``, ` `, `{}`, ` { } `, `[]`, `[ ]`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":}`, `{,}`, `{"a":1 "b":2}`,
	`{"a":[1,2,{"b":null}],"c":{"d":[]}}`, `[1,]`, `[,1]`, `[1 2]`, `{"a":1}}`, `{"a":1}]`, `[{]}`, `{[}]`, `{"a":[}`,
	`"x"`, `"\u00e9\n\t\"\\\/"`, `"\u00g0"`, `"\u00e"`, `"\x"`, `"` + "\x01" + `"`, `"` + "\xff" + `"`, `"abc`, `"\`,
	`true`, `tru`, `truex`, `false`, `null`, `nul`, `nulll`, `True`,
	`0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-1.5e-3`, `+1`, `0x10`, `1 2`,
	`{"id":1,"op":"acquire","name":"a","ttl_ms":15000}`, "{\"a\":1}\r\n", `{"a":1}x`, `{"a"` + ":\t1}",
	strings.Repeat("[", 40) + strings.Repeat("]", 40), strings.Repeat("[", 40) + strings.Repeat("]", 39),
	strings.Repeat(`{"a":`, 30) + `1` + strings.Repeat("}", 30),
	// json.Valid's depth limit, empty containers counted.
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	`{"x":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`, `{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	`{"x":` + strings.Repeat("[", 9998) + "{}" + strings.Repeat("]", 9998) + `}`, `{"x":` + strings.Repeat("[", 9999) + "{}" + strings.Repeat("]", 9999) + `}`,
}

func TestValidJSON(t *testing.T) {
	for _, c := range validJSONCases {
		if got, want := validJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("validJSON(%q) = %v, json.Valid says %v", c, got, want)
		}
	}
}

// FuzzValidJSON checks validJSON against json.Valid on any input.
func FuzzValidJSON(f *testing.F) {
	for _, c := range validJSONCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

func BenchmarkValidJSON(b *testing.B) {
	line := []byte(`{"id":1,"op":"acquire","name":"bench/pair/12","ttl_ms":15000}`)
	b.Run("validJSON", func(b *testing.B) {
		for b.Loop() {
			validJSON(line)
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		for b.Loop() {
			json.Valid(line)
		}
	})
}

func TestLoneSurrogate(t *testing.T) {
	for line, lone := range map[string]bool{
		`{"name":"a"}`:                  false,
		`{"name":"\u00e9\n"}`:           false,
		`{"name":"\ud83d\ude00"}`:       false, // a pair: U+1F600
		`{"name":"\uD83D\uDE00x"}`:      false,
		`{"name":"\ufffd"}`:             false,
		`{"name":"\\ud800"}`:            false, // a backslash, then "ud800"
		`{"name":"\\\ud83d\ude00"}`:     false,
		`{"name":"\ud800"}`:             true,
		`{"name":"\udfff"}`:             true,
		`{"name":"sur\ud800x"}`:         true,
		`{"name":"\ud800\u0041"}`:       true, // a high one, then not a low one
		`{"name":"\ud800\ud800\udc00"}`: true,
		`{"name":"\ude00\ud83d"}`:       true, // the pair in the wrong order
		`{"name":"a","x":"\ud800"}`:     true,
		`{"name":"\\\ud800"}`:           true,
		`"\ud800`:                       true,
		`"\ud80`:                        false, // not JSON: refused as such
		`"\ud800\u`:                     true,
	} {
		if got := loneSurrogate([]byte(line)); got != lone {
			t.Errorf("loneSurrogate(%s) = %v, want %v", line, got, lone)
		}
	}
}

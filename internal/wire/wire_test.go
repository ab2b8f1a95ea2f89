package wire

import (
	"encoding/json"
	"testing"
)

// TestAppendString: the hand-written encoder reads back as encoding/json's.
func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "orders/42", `q"uote\back`, "tab\tnl\n\x00\x1f", "é€𝄞", "bad\xff\xfeutf8", "\u2028<&>"} {
		var got, want string
		if err := json.Unmarshal(AppendString(nil, s), &got); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		b, _ := json.Marshal(s)
		if err := json.Unmarshal(b, &want); err != nil || got != want {
			t.Errorf("%q: got %q, want %q (%v)", s, got, want, err)
		}
	}
}

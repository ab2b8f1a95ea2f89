package socketapi

import "bytes"

// maxDepth is json.Valid's limit of containers open at once.
const maxDepth = 10000

// validJSON reports whether b is exactly one JSON value with optional
// white space around it: what json.Valid reports, at a few times its
// speed, for it runs on every request line. Like json.Valid, it leaves
// the bytes inside strings to the caller's UTF-8 check, and refuses
// containers nested more than maxDepth deep.
func validJSON(b []byte) bool {
	var stackBuf [16]byte
	open := stackBuf[:0] // the '{' or '[' of each container not yet closed
	i := skipSpace(b, 0)
	for {
		// A value begins at i.
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case '{', '[':
			c := b[i]
			if len(open) == maxDepth {
				return false
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': empty
				i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if i = member(b, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = validString(b, i)
		case 't':
			i = literal(b, i, "true")
		case 'f':
			i = literal(b, i, "false")
		case 'n':
			i = literal(b, i, "null")
		default:
			i = number(b, i)
		}
		if i < 0 {
			return false
		}
		// A value ended at i: close what it ends, then go on to the next
		// element, or end.
	next:
		for {
			i = skipSpace(b, i)
			if len(open) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := open[len(open)-1]
			switch {
			case b[i] == ',' && top == '{':
				if i = member(b, skipSpace(b, i+1)); i < 0 {
					return false
				}
				break next
			case b[i] == ',':
				i = skipSpace(b, i+1)
				break next
			case b[i] == '}' && top == '{', b[i] == ']' && top == '[':
				open = open[:len(open)-1]
				i++
			default:
				return false
			}
		}
	}
}

// member reads an object member's key and colon at b[i], and returns
// where its value begins, or -1.
func member(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipSpace(b, i+1)
}

// plain marks the bytes that a string holds as they are: all but the
// quote, the backslash and the control characters.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// validString returns the index just past the string at b[i], or -1.
func validString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		for i < len(b) && plain[b[i]] {
			i++
		}
		if i == len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// literal returns the index just past word at b[i], or -1.
func literal(b []byte, i int, word string) int {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// number returns the index just past the number at b[i], or -1:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// digits returns the index just past the digits from b[i].
func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// loneSurrogate reports whether a string of b escapes a surrogate that is
// not half of a pair (a high one, \ud800–\udbff, not followed by an
// escaped low one, \udc00–\udfff, or a low one alone). Such a string is
// not Unicode text: decoders replace the surrogate with U+FFFD, so that
// two different names would be one lock.
func loneSurrogate(b []byte) bool {
	for i := bytes.IndexByte(b, '\\'); i >= 0 && i+1 < len(b); {
		if b[i+1] != 'u' {
			i = next(b, i+2)
			continue
		}
		r, ok := hex4(b, i+2)
		switch {
		case !ok: // not JSON: refused later
			return false
		case 0xdc00 <= r && r <= 0xdfff:
			return true
		case 0xd800 <= r && r <= 0xdbff:
			if i+11 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
				return true
			}
			if lo, ok := hex4(b, i+8); !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i = next(b, i+12)
		default:
			i = next(b, i+6)
		}
	}
	return false
}

// next returns the index of the first backslash of b from i, or -1.
func next(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	if j := bytes.IndexByte(b[i:], '\\'); j >= 0 {
		return i + j
	}
	return -1
}

// hex4 reads the four hexadecimal digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

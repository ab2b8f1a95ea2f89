package socketapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/lockagent/lockagent/internal/wire"
)

// decodeError is a request that cannot be decoded: bad_request for a line
// that is not a JSON object or has a key twice, invalid_argument for a
// field of the wrong type (named in the message).
type decodeError struct {
	code string
	msg  string
}

func (e *decodeError) Error() string { return e.msg }

var (
	errNotObject = &decodeError{wire.CodeBadRequest, "a request is one JSON object per line"}
	errTooDeep   = &decodeError{wire.CodeBadRequest, fmt.Sprintf("a request is one JSON object per line, with values nested at most %d deep", maxDepth)}
)

// decodeRequest reads a request line into req. It reads only the top level
// of the object, which is all a request has, in one pass: every value is
// decoded by the type of its field, unknown keys are skipped, and a key
// that appears twice is refused (JSON libraries disagree on which of the
// two values wins, so the agent does not guess). req.ID is set whenever
// the line is an object, so that errors can echo it.
func decodeRequest(line []byte, req *request) *decodeError {
	if !validJSON(line) {
		if tooDeep(line) {
			return errTooDeep
		}
		return errNotObject
	}
	i := skipSpace(line, 0)
	if line[i] != '{' {
		return errNotObject
	}
	// Requests have few keys: a short list, without allocation; a map
	// past it, so that a line of many keys costs linear time.
	var seenBuf [16][]byte
	seen := seenBuf[:0]
	var seenMap map[string]struct{}
	var typeErr *decodeError
	i = skipSpace(line, i+1)
	for line[i] != '}' {
		keyEnd := stringEnd(line, i)
		key := unquote(line[i:keyEnd])
		if seenMap == nil && len(seen) == cap(seen) {
			seenMap = make(map[string]struct{}, 2*len(seen))
			for _, k := range seen {
				seenMap[string(k)] = struct{}{}
			}
		}
		dup := false
		if seenMap != nil {
			_, dup = seenMap[string(key)]
			seenMap[string(key)] = struct{}{}
		} else {
			for _, k := range seen {
				dup = dup || bytes.Equal(k, key)
			}
			seen = append(seen, key)
		}
		if dup {
			return &decodeError{wire.CodeBadRequest, fmt.Sprintf("key %q appears twice", key)}
		}
		i = skipSpace(line, keyEnd)
		i = skipSpace(line, i+1) // the colon
		end := valueEnd(line, i)
		if err := req.set(string(key), line[i:end]); err != nil && typeErr == nil {
			typeErr = err
		}
		i = skipSpace(line, end)
		if line[i] == ',' {
			i = skipSpace(line, i+1)
		}
	}
	return typeErr
}

// set decodes one top-level value into the field of its key.
func (req *request) set(key string, v []byte) *decodeError {
	if string(v) == "null" { // null is absent, as for a missing key
		return nil
	}
	switch key {
	case "id": // copied: the line's buffer is reused for the next line
		req.ID = append(json.RawMessage(nil), v...)
	case "target":
		if !validID(v) {
			return typeError(key, "string or integer")
		}
		req.Target = append(json.RawMessage(nil), v...)
	case "op":
		if v[0] == '"' {
			if op, known := opNames[string(unquote(v))]; known {
				req.Op = op // the name of a known op, not a copy
				return nil
			}
		}
		return setString(key, v, &req.Op)
	case "client":
		return setStringPtr(key, v, &req.Client, &req.vals.client)
	case "name":
		return setStringPtr(key, v, &req.Name, &req.vals.name)
	case "mode":
		return setStringPtr(key, v, &req.Mode, &req.vals.mode)
	case "scope":
		return setStringPtr(key, v, &req.Scope, &req.vals.scope)
	case "meta":
		return setStringPtr(key, v, &req.Meta, &req.vals.meta)
	case "lease":
		return setStringPtr(key, v, &req.Lease, &req.vals.lease)
	case "campaign":
		return setStringPtr(key, v, &req.Campaign, &req.vals.campaign)
	case "after":
		return setStringPtr(key, v, &req.After, &req.vals.after)
	case "version":
		return setInt(key, v, &req.Version, &req.vals.version)
	case "session_ttl_ms":
		return setInt(key, v, &req.SessionTTLMs, &req.vals.sessionTTLMs)
	case "heartbeat_ms":
		return setInt(key, v, &req.HeartbeatMs, &req.vals.heartbeatMs)
	case "limit":
		return setInt(key, v, &req.Limit, &req.vals.limit)
	case "ttl_ms":
		return setInt(key, v, &req.TTLMs, &req.vals.ttlMs)
	case "wait_ms":
		return setInt(key, v, &req.WaitMs, &req.vals.waitMs)
	case "all":
		switch string(v) {
		case "true", "false":
			b := v[0] == 't'
			req.All = &b
		default:
			return typeError(key, "boolean")
		}
	case "resume":
		r, err := decodeResume(v)
		if err != nil {
			return err
		}
		req.Resume = r
	}
	return nil
}

// decodeResume reads the object of resume, which must be valid JSON: its
// keys exactly as written ("session", "token"; compared after unescaping,
// as top-level keys are), each at most once and a string. Other keys are
// skipped, as at the top level.
func decodeResume(v []byte) (*wire.Resume, *decodeError) {
	bad := typeError("resume", `object {"session": string, "token": string}`)
	if v[0] != '{' {
		return nil, bad
	}
	var r wire.Resume
	var seen [2]bool
	i := skipSpace(v, 1)
	for v[i] != '}' {
		keyEnd := stringEnd(v, i)
		key := string(unquote(v[i:keyEnd]))
		i = skipSpace(v, skipSpace(v, keyEnd)+1) // past the colon
		end := valueEnd(v, i)
		k, dst := 0, &r.Session
		switch key {
		case "token":
			k, dst = 1, &r.Token
			fallthrough
		case "session":
			if seen[k] {
				return nil, &decodeError{wire.CodeInvalidArgument, fmt.Sprintf("resume has the key %q twice", key)}
			}
			seen[k] = true
			if v[i] != '"' {
				return nil, bad
			}
			*dst = string(unquote(v[i:end]))
		}
		i = skipSpace(v, end)
		if v[i] == ',' {
			i = skipSpace(v, i+1)
		}
	}
	return &r, nil
}

func typeError(key, want string) *decodeError {
	return &decodeError{wire.CodeInvalidArgument, fmt.Sprintf("%s must be a JSON %s", key, want)}
}

func setString(key string, v []byte, dst *string) *decodeError {
	if v[0] != '"' {
		return typeError(key, "string")
	}
	*dst = string(unquote(v))
	return nil
}

// setStringPtr decodes v into *val and points *dst to it.
func setStringPtr(key string, v []byte, dst **string, val *string) *decodeError {
	if err := setString(key, v, val); err != nil {
		return err
	}
	*dst = val
	return nil
}

// setInt decodes v into *val and points *dst to it.
func setInt(key string, v []byte, dst **int64, val *int64) *decodeError {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return typeError(key, "integer in range")
	}
	*val = n
	*dst = val
	return nil
}

// unquote returns the contents of a valid JSON string literal.
func unquote(lit []byte) []byte {
	inner := lit[1 : len(lit)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner
	}
	var s string
	json.Unmarshal(lit, &s) // valid: checked by validJSON
	return []byte(s)
}

// tooDeep tells whether line, which is not valid JSON, opens more than
// maxDepth containers at once, strings aside.
func tooDeep(line []byte) bool {
	depth := 0
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case '"':
			i = stringEnd(line, i) - 1
		case '{', '[':
			if depth++; depth > maxDepth {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

func skipSpace(line []byte, i int) int {
	for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at line[i].
func stringEnd(line []byte, i int) int {
	for j := i + 1; j < len(line); j++ {
		switch line[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(line)
}

// valueEnd returns the index just past the valid JSON value at line[i].
func valueEnd(line []byte, i int) int {
	switch line[i] {
	case '"':
		return stringEnd(line, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(line); j++ {
			switch line[j] {
			case '"':
				j = stringEnd(line, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(line)
	}
	j := i
	for j < len(line) && bytes.IndexByte([]byte(" \t\r\n,}]"), line[j]) < 0 {
		j++
	}
	return j
}

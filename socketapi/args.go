package socketapi

import (
	"fmt"
	"time"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

// The decoding of ops' arguments into the agent's requests: types,
// units and the wire's own encodings. The agent checks the values.

func parseMode(s *string) (backend.Mode, error) {
	switch {
	case s == nil || *s == "exclusive":
		return backend.Exclusive, nil
	case *s == "shared":
		return backend.Shared, nil
	}
	return 0, fmt.Errorf("%w: mode must be exclusive or shared", agent.ErrInvalidArgument)
}

func parseScope(s *string) (agent.Scope, error) {
	switch {
	case s == nil || *s == "connection":
		return agent.ScopeConnection, nil
	case *s == "session":
		return agent.ScopeSession, nil
	}
	return 0, fmt.Errorf("%w: scope must be connection or session", agent.ErrInvalidArgument)
}

// maxMillis bounds every *_ms argument, so that converting it to a
// time.Duration cannot overflow.
const maxMillis = int64(1<<63-1) / int64(time.Millisecond)

func millis(field string, v *int64) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	if *v > maxMillis || *v < -maxMillis {
		return 0, fmt.Errorf("%w: %s is out of range", agent.ErrInvalidArgument, field)
	}
	return time.Duration(*v) * time.Millisecond, nil
}

// parseAcquire decodes acquire's arguments; the agent checks them.
func parseAcquire(req *request) (agent.AcquireRequest, error) {
	var ar agent.AcquireRequest
	var err error
	ar.Name = nameArg(req)
	if ar.Mode, err = parseMode(req.Mode); err != nil {
		return ar, err
	}
	if ar.Scope, err = parseScope(req.Scope); err != nil {
		return ar, err
	}
	if req.Limit != nil {
		// An explicit limit is at least 1: 0, which the agent takes for
		// none, and less are passed on as -1, which it refuses.
		ar.Limit = int(min(max(*req.Limit, -1), agent.MaxLimit+1))
		if ar.Limit == 0 {
			ar.Limit = -1
		}
	}
	if ar.TTL, err = ttlArg(req.TTLMs); err != nil {
		return ar, err
	}
	if ar.Wait, err = millis("wait_ms", req.WaitMs); err != nil {
		return ar, err
	}
	if req.WaitMs != nil && *req.WaitMs == -1 {
		ar.Wait = agent.WaitForever // other negative waits the agent refuses
	}
	if req.Meta != nil {
		ar.Meta = *req.Meta
	}
	return ar, nil
}

// ttlArg decodes ttl_ms. Absent, it is the agent's default (0); an explicit
// 0 or less is passed on as a negative TTL, which the agent refuses.
func ttlArg(v *int64) (time.Duration, error) {
	d, err := millis("ttl_ms", v)
	if err == nil && v != nil && *v <= 0 {
		d = -1
	}
	return d, err
}

// wireArgs are the agent's arguments as the wire names them, with the
// rule of those whose wire encoding is not the agent's.
var wireArgs = map[agent.Arg]struct{ name, rule string }{
	agent.ArgTTL:        {"ttl_ms", ""},
	agent.ArgWait:       {"wait_ms", "must be -1, 0 or positive"},
	agent.ArgLimit:      {"limit", ""},
	agent.ArgMeta:       {"meta", ""},
	agent.ArgSessionTTL: {"session_ttl_ms", ""},
	agent.ArgClient:     {"client", ""},
}

// argMessage says what is wrong with an argument, in the wire's terms.
func argMessage(e *agent.ArgError) string {
	w, ok := wireArgs[e.Arg]
	switch {
	case !ok:
		return e.Error()
	case w.rule != "":
		return w.name + " " + w.rule
	case e.Rule != "":
		return w.name + " " + e.Rule
	}
	return fmt.Sprintf("%s must be between %d and %d", w.name, e.Min.Milliseconds(), e.Max.Milliseconds())
}

// nameArg is the request's name; none is the empty name, which the agent
// refuses.
func nameArg(req *request) string {
	if req.Name == nil {
		return ""
	}
	return *req.Name
}

func leaseArg(req *request) (string, error) {
	if req.Lease == nil {
		return "", fmt.Errorf("%w: lease is required", agent.ErrNotHeld)
	}
	return *req.Lease, nil
}

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

func (c *conn) parseAcquire(req *request) (agent.AcquireRequest, error) {
	var ar agent.AcquireRequest
	var err error
	if req.Name == nil {
		return ar, fmt.Errorf("%w: name is required", agent.ErrInvalidName)
	}
	ar.Name = *req.Name
	if ar.Mode, err = parseMode(req.Mode); err != nil {
		return ar, err
	}
	if ar.Scope, err = parseScope(req.Scope); err != nil {
		return ar, err
	}
	if req.Limit != nil {
		if *req.Limit < 1 || *req.Limit > 1<<31 {
			return ar, fmt.Errorf("%w: limit must be a positive integer", agent.ErrInvalidArgument)
		}
		ar.Limit = int(*req.Limit)
	}
	if ar.TTL, err = millis("ttl_ms", req.TTLMs); err != nil {
		return ar, err
	}
	if req.TTLMs != nil && *req.TTLMs <= 0 {
		return ar, fmt.Errorf("%w: ttl_ms must be positive", agent.ErrInvalidArgument)
	}
	if ar.Wait, err = millis("wait_ms", req.WaitMs); err != nil {
		return ar, err
	}
	if req.WaitMs != nil && *req.WaitMs < 0 {
		if *req.WaitMs != -1 {
			return ar, fmt.Errorf("%w: wait_ms must be -1, 0 or positive", agent.ErrInvalidArgument)
		}
		ar.Wait = agent.WaitForever
	}
	if req.Meta != nil {
		ar.Meta = *req.Meta
	}
	return ar, nil
}

func leaseArg(req *request) (string, error) {
	if req.Lease == nil {
		return "", fmt.Errorf("%w: lease is required", agent.ErrNotHeld)
	}
	return *req.Lease, nil
}

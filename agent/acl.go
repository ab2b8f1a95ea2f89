package agent

import (
	"fmt"
	"slices"

	"github.com/lockagent/lockagent/backend"
)

// Access is who may lock which names, and who is an admin. The zero value
// has no rules: every peer may lock every name, and uid 0 alone is an admin.
type Access struct {
	// AdminUIDs and the members of AdminGIDs may list every session and
	// break locks. Both nil: uid 0 only.
	AdminUIDs []uint32
	AdminGIDs []uint32
	// Rules restrict locking when there are any: a name is allowed to a
	// peer in a mode when a rule matching the name allows both. Nil: every
	// name to every peer.
	Rules []Rule
}

// Rule allows peers to lock the names that match Pattern. A rule without
// UIDs and GIDs applies to every peer; without Modes, to every mode.
type Rule struct {
	// Pattern is a glob: * matches any run of characters, / included, and
	// ? one character; every other character stands for itself.
	Pattern string
	UIDs    []uint32
	GIDs    []uint32 // the peer's primary group or one of its groups
	Modes   []backend.Mode
}

// SetAccess replaces the access rules, for connections old and new; it is
// how a reload takes effect.
func (a *Agent) SetAccess(acc Access) {
	if acc.AdminUIDs == nil && acc.AdminGIDs == nil {
		acc.AdminUIDs = []uint32{0}
	}
	a.access.Store(&acc)
}

// IsAdmin tells whether the peer has admin rights: ctl list -all and
// break, and the AdminReserve beyond the caps on sessions and
// connections.
func (a *Agent) IsAdmin(p Peer) bool {
	acc := a.access.Load()
	return slices.Contains(acc.AdminUIDs, p.UID) || p.inAny(acc.AdminGIDs)
}

// allow checks that the peer may lock name in mode. The error names the
// name and the mode, never the rules.
func (a *Agent) allow(p Peer, name string, mode backend.Mode) error {
	if a.access.Load().allows(p, name, mode) {
		return nil
	}
	return fmt.Errorf("%w: %q in mode %s is not allowed to uid %d", ErrPermissionDenied, name, mode, p.UID)
}

// allowAnyMode checks that the peer may lock name in some mode: what
// inspect needs.
func (a *Agent) allowAnyMode(p Peer, name string) error {
	acc := a.access.Load()
	if acc.allows(p, name, backend.Exclusive) || acc.allows(p, name, backend.Shared) {
		return nil
	}
	return fmt.Errorf("%w: %q is not allowed to uid %d", ErrPermissionDenied, name, p.UID)
}

func (acc *Access) allows(p Peer, name string, mode backend.Mode) bool {
	if acc.Rules == nil {
		return true
	}
	for _, r := range acc.Rules {
		if !Glob(r.Pattern, name) {
			continue
		}
		peerOK := (r.UIDs == nil && r.GIDs == nil) || slices.Contains(r.UIDs, p.UID) || p.inAny(r.GIDs)
		if peerOK && (r.Modes == nil || slices.Contains(r.Modes, mode)) {
			return true
		}
	}
	return false
}

// inAny tells whether the peer's primary group or one of its groups is
// among gids.
func (p Peer) inAny(gids []uint32) bool {
	if slices.Contains(gids, p.GID) {
		return true
	}
	for _, g := range p.Groups {
		if slices.Contains(gids, g) {
			return true
		}
	}
	return false
}

// Glob reports whether name matches pattern, where * matches any run of
// characters, / included, ? matches one character, and every other
// character stands for itself.
func Glob(pattern, name string) bool {
	// The classic linear matcher: on a mismatch, go back to the last star
	// and let it swallow one more character.
	p, n := []rune(pattern), []rune(name)
	pi, ni := 0, 0
	star, mark := -1, 0
	for ni < len(n) {
		switch {
		case pi < len(p) && p[pi] == '*': // before a literal: a name may hold a '*'
			star, mark = pi, ni
			pi++
		case pi < len(p) && (p[pi] == '?' || p[pi] == n[ni]):
			pi++
			ni++
		case star >= 0:
			mark++
			pi, ni = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// auditLog records an admin action, with who did it.
func (a *Agent) auditLog(action string, s *Session, kv ...any) {
	p := s.currentPeer()
	args := []any{"action", action, "uid", p.UID, "gid", p.GID, "pid", p.PID, "session", s.id}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != nil { // a nil error says nothing
			args = append(args, kv[i], kv[i+1])
		}
	}
	a.audit.Info("admin action", args...)
}

// uncount takes a lease or a pending acquire off its uid's count. a.mu is
// held.
func (a *Agent) uncount(uid uint32) {
	if a.perUID[uid]--; a.perUID[uid] <= 0 {
		delete(a.perUID, uid)
	}
}

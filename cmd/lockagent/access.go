package main

import (
	"fmt"
	"os"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/config"
)

// accessOf turns the acl block into the agent's access rules, with groups
// resolved to gids. Without an acl block, or without admin_uids and
// admin_groups in it, root and the agent's own uid are the admins.
func accessOf(cfg config.Config) (agent.Access, error) {
	builtin := []uint32{0, uint32(os.Getuid())}
	a := cfg.ACL
	if a == nil {
		return agent.Access{AdminUIDs: builtin}, nil
	}
	acc := agent.Access{AdminUIDs: builtin}
	if a.AdminUIDs != nil || a.AdminGroups != nil {
		// Non-nil even when empty: the agent reads nil as "root only".
		acc.AdminUIDs = append([]uint32{}, a.AdminUIDs...)
		gids, err := gidsOf(a.AdminGroups)
		if err != nil {
			return acc, fmt.Errorf("acl.admin_groups: %w", err)
		}
		acc.AdminGIDs = append([]uint32{}, gids...)
	}
	if a.Rules == nil {
		return acc, nil
	}
	acc.Rules = []agent.Rule{}
	for _, r := range a.Rules {
		gids, err := gidsOf(r.Groups)
		if err != nil {
			return acc, fmt.Errorf("acl.rule %q.groups: %w", r.Pattern, err)
		}
		rule := agent.Rule{Pattern: r.Pattern, UIDs: r.UIDs, GIDs: gids}
		if r.Groups != nil && gids == nil {
			rule.GIDs = []uint32{}
		}
		for _, m := range r.Modes {
			mode := backend.Exclusive
			if m == "shared" {
				mode = backend.Shared
			}
			rule.Modes = append(rule.Modes, mode)
		}
		acc.Rules = append(acc.Rules, rule)
	}
	return acc, nil
}

// gidsOf resolves group names and numbers; nil stays nil.
func gidsOf(groups []string) ([]uint32, error) {
	var gids []uint32
	for _, g := range groups {
		gid, err := config.GroupID(g)
		if err != nil {
			return nil, err
		}
		gids = append(gids, gid)
	}
	return gids, nil
}

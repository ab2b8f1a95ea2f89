# The documented example with the memory backend. Groups that exist on every
# Linux host (root, gids) stand in for lockagent, lockagent-admin and billing.

socket {
  path  = "/run/lockagent/agent.sock"   # LOCKAGENT_SOCKET and -socket override
  mode  = "0660"
  group = "root"                        # who may connect; empty: the agent's group
}

state_dir  = "/var/lib/lockagent"       # the memory backend's fencing epoch lives here
log_level  = "info"                     # trace, debug, info, warn, error
log_format = "text"                     # or "json"

backend "memory" {}                     # the default

leases {
  default_ttl = "15s"
  min_ttl     = "1s"
  max_ttl     = "24h"
}

limits {
  max_sessions           = 10000
  max_leases_per_session = 1000
  max_waiters            = 10000
  max_line_bytes         = 65536
}

acl {
  admin_uids   = [0]                    # may list every session and break locks
  admin_groups = ["root"]
  rule "orders/*" {                     # glob on lock names
    uids   = [1001]
    groups = ["root", 1001]             # a name or a gid
    modes  = ["exclusive", "shared"]
  }
}

metrics {
  address = "127.0.0.1:9464"            # Prometheus text format at /metrics; unset: off
}

# lockagent's configuration, read by lockagent.service. Every setting is
# described in /usr/share/doc/lockagent/docs/config.md; check a change with
#   lockagent config check -config /etc/lockagent/lockagent.hcl
# then apply it with `systemctl restart lockagent` (`systemctl reload
# lockagent` applies the acl block and log_level alone).

# Under systemd, lockagent.socket owns the socket and sets its mode and
# group (members of the lockagent group may connect); these settings apply
# when the agent binds the socket itself.
socket {
  path  = "/run/lockagent/agent.sock"
  mode  = "0660"
  group = "lockagent"
}

state_dir  = "/var/lib/lockagent"   # the fencing epoch: tokens keep increasing across restarts
log_level  = "info"                 # trace, debug, info, warn, error
log_format = "text"                 # or "json"; the journal gets each entry's priority either way

backend "memory" {}                 # locks for the processes of this host

# To share locks between hosts, use Redis instead of the block above. Put
# its password in /etc/credstore/lockagent.redis.password (mode 0600, owned
# by root): the service loads it as its credential redis.password.
#
# backend "redis" {
#   addresses           = ["10.0.0.5:6379"]
#   password_credential = "redis.password"
# }
#
# Sentinels that want a password of their own get it from
# /etc/credstore/lockagent.sentinel.password, loaded as sentinel.password:
#   master_name                  = "locks"
#   sentinel_password_credential = "sentinel.password"


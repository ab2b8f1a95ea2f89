# lockagent's configuration, read by lockagent.service. Every setting is
# described in /usr/share/doc/lockagent/docs/config.md; check a change with
#   lockagent config check -config /etc/lockagent/lockagent.hcl
# then apply it with `systemctl restart lockagent` (`systemctl reload
# lockagent` applies the acl block and log_level alone).

# Under systemd, lockagent.socket owns the socket and sets its mode and
# group (members of the lockagent group may connect); these settings apply
# when the agent binds the socket itself. The package creates the group
# lockagent; on a host without it, config check and the agent refuse the
# file (unknown group).
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
# by root): the service loads it as its credential redis.password, into
# $CREDENTIALS_DIRECTORY, which only the unit sets (config check run from a
# shell needs it too: see docs/config.md).
#
# backend "redis" {
#   addresses           = ["10.0.0.5:6379"]
#   password_credential = "redis.password"
# }
#
# Through Sentinel, whose sentinels want a password of their own, put in
# /etc/credstore/lockagent.sentinel.password (loaded as the credential
# sentinel.password):
#
# backend "redis" {
#   addresses                    = ["10.0.0.5:26379", "10.0.0.6:26379", "10.0.0.7:26379"]
#   master_name                  = "locks"
#   password_credential          = "redis.password"
#   sentinel_password_credential = "sentinel.password"
# }


# The documented example with a Redis backend reached through Sentinel.

socket {
  path  = "/run/lockagent/agent.sock"
  mode  = "0600"
  group = ""
}

state_dir  = "/srv/lockagent/state"
log_level  = "debug"
log_format = "json"

backend "redis" {
  addresses     = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
  master_name   = "locks"
  cluster       = false
  username      = "lockagent"
  password_file = "/etc/lockagent/redis.password" # never a password inline
  sentinel_username      = "watcher"
  sentinel_password_file = "/etc/lockagent/sentinel.password"
  db            = 2
  key_prefix    = "locks"
  wait_replicas = 1       # a grant is handed out once a replica has it
  wait_timeout  = "250ms"

  tls {
    ca_file   = "/etc/lockagent/ca.pem"
    cert_file = "/etc/lockagent/client.pem"
    key_file  = "/etc/lockagent/client.key"
  }
}

leases {
  default_ttl = "30s"
  min_ttl     = "500ms"
  max_ttl     = "1h30m"
}

limits {
  max_sessions           = 500
  max_leases_per_session = 50
  max_waiters            = 2000
  max_line_bytes         = 1048576
  max_connections_per_uid = 100
  max_output_bytes        = 33554432
  max_output_bytes_per_uid = 4194304
  max_sessions_per_uid    = 200
  max_leases_per_uid     = 20
}

acl {
  admin_uids = []                       # nobody by uid: only the admin group
  admin_groups = ["0"]

  rule "orders/*" {
    uids  = [1001, 1002]
    modes = ["exclusive"]
  }

  rule "reports/??" {
    groups = ["root"]
  }

  rule "*" {}
}

backend "redis" {
  addresses                    = ["127.0.0.1:26379"]
  master_name                  = "locks"
  sentinel_password_file       = "/etc/lockagent/sentinel.password"
  sentinel_password_credential = "sentinel-password"
}

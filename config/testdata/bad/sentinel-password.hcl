backend "redis" {
  addresses         = ["127.0.0.1:26379"]
  master_name       = "locks"
  sentinel_password = "hunter2"
}

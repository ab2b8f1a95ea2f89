backend "redis" {
  addresses         = ["127.0.0.1:6379"]
  sentinel_username = "watcher"
}

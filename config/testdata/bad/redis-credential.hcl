backend "redis" {
  addresses           = ["127.0.0.1:6379"]
  password_file       = "/etc/lockagent/redis.password"
  password_credential = "redis-password"
}

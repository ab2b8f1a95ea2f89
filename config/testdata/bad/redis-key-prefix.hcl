backend "redis" {
  addresses  = ["127.0.0.1:6379"]
  key_prefix = "app{1}"
}

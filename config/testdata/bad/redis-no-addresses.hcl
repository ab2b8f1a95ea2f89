backend "redis" {
  key_prefix = "locks"
}

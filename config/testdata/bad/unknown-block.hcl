log_level = "info"

cache {
  size = 10
}

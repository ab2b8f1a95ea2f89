backend "redis" {
  addresses = ["10.0.0.1:6379", "10.0.0.2:6379"]
  cluster   = true
  db        = 3
}

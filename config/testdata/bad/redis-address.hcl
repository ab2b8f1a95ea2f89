backend "redis" {
  addresses   = ["10.0.0.1:26379", "10.0.0.2"]
  master_name = "locks"
}

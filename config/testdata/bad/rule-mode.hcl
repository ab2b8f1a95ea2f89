acl {
  rule "orders/*" {
    modes = ["exclusive", "read"]
  }
}

acl {
  rule "orders/*" {
    modes = []
  }
}

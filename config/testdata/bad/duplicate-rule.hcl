acl {
  rule "orders/*" {
    modes = ["shared"]
  }
  rule "orders/*" {
    modes = ["exclusive"]
  }
}

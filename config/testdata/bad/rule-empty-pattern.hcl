acl {
  rule "" {
    uids = [1001]
  }
}

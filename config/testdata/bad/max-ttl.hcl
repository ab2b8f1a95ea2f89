leases {
  max_ttl = "48h"
}

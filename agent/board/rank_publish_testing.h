// TEST ONLY: reaches into a RankPublisher (include/tern/rank_publish.h) to
// put it on the paths no input can reach, such as a commit whose own
// records cannot be applied (a bug or an allocation failure), so that what
// the publisher does then is tested. Used by agent/board/rank_publish_test.cc.
#pragma once

#include "tern/rank_publish.h"

namespace tern {

struct RankPublisherTestPeer {
  // Damages the pending part's records so that Committed() cannot apply
  // them to the previous view.
  static void DamagePendingRecords(RankPublisher& p);
};

}  // namespace tern

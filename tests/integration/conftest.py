from tests.integration.broker_fixtures import *  # noqa: F403
from tests.integration.milvus_fixtures import *  # noqa: F403

'use strict';
/** checkpointd Node client: see README.md in this folder. */

const { CheckpointdClient, ConfigWatch } = require('./client');
const { AUTO_TRIGGERS, loadContract } = require('./contract');
const { CheckpointUnavailableError, CheckpointdError } = require('./errors');
const { newPlanId } = require('./ids');
const { registerLocalFileTools } = require('./local_tools');
const { ToolCheckpointInterceptor, ToolRunner, TriggerPolicy } = require('./tool_runner');
const { fromValue, timestampToDate, toValue } = require('./values');

/** Every ErrorInfo.reason checkpointd can send, from checkpoint.v1.ErrorReason in errors.proto. */
const ERROR_REASONS = loadContract().errorReasons;

module.exports = {
  AUTO_TRIGGERS,
  CheckpointUnavailableError,
  CheckpointdClient,
  CheckpointdError,
  ConfigWatch,
  ERROR_REASONS,
  ToolCheckpointInterceptor,
  ToolRunner,
  TriggerPolicy,
  fromValue,
  newPlanId,
  registerLocalFileTools,
  timestampToDate,
  toValue,
};

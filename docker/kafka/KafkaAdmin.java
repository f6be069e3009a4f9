// kafka-admin: the modeswitch-kafka image's health check and topic tool, on the broker's own
// kafka-clients (the Maven artifacts carry no kafka-topics tool). Compiled when the image is
// built; run as `kafka-admin COMMAND` inside the container:
//
//   kafka-admin health                  the cluster's metadata answers, every partition has a
//                                       leader (exit 0), else why not (exit 1)
//   kafka-admin list                    the topics, one a line
//   kafka-admin describe TOPIC          its partitions and their leaders
//   kafka-admin create-topic TOPIC [--partitions N] [--replication-factor N]
//                                  [--config KEY=VALUE]... [--if-not-exists]
//
// --bootstrap HOST:PORT (before or after the command; $KAFKA_ADMIN_BOOTSTRAP, else
// localhost:9092) is where it connects; --timeout SECONDS bounds every request (10).
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.TopicExistsException;

public final class KafkaAdmin {
    private static final String USAGE = String.join("\n",
        "usage: kafka-admin [--bootstrap HOST:PORT] [--timeout SECONDS] COMMAND",
        "  health",
        "  list",
        "  describe TOPIC",
        "  create-topic TOPIC [--partitions N] [--replication-factor N] [--config KEY=VALUE]... [--if-not-exists]",
        "(--partitions and --replication-factor default to the broker's num.partitions and",
        "default.replication.factor)");

    public static void main(String[] argv) {
        String env = System.getenv("KAFKA_ADMIN_BOOTSTRAP");
        String bootstrap = env == null || env.isEmpty() ? "localhost:9092" : env;
        int timeout = 10;
        Integer partitions = null;
        Short replication = null;
        boolean ifNotExists = false;
        Map<String, String> configs = new HashMap<>();
        List<String> words = new ArrayList<>();
        try {
            for (int i = 0; i < argv.length; i++) {
                String a = argv[i];
                switch (a) {
                    case "--bootstrap" -> bootstrap = argv[++i];
                    case "--timeout" -> timeout = Integer.parseInt(argv[++i]);
                    case "--partitions" -> partitions = Integer.parseInt(argv[++i]);
                    case "--replication-factor" -> replication = Short.parseShort(argv[++i]);
                    case "--if-not-exists" -> ifNotExists = true;
                    case "--config" -> {
                        String kv = argv[++i];
                        int eq = kv.indexOf('=');
                        if (eq <= 0) throw new IllegalArgumentException("--config wants KEY=VALUE, not " + kv);
                        configs.put(kv.substring(0, eq), kv.substring(eq + 1));
                    }
                    case "-h", "--help" -> {
                        System.out.println(USAGE);
                        return;
                    }
                    default -> {
                        if (a.startsWith("--")) throw new IllegalArgumentException("unknown option " + a);
                        words.add(a);
                    }
                }
            }
        } catch (ArrayIndexOutOfBoundsException | IllegalArgumentException e) {
            fail(2, (e instanceof ArrayIndexOutOfBoundsException ? "an option lacks its value" : e.getMessage()) + "\n" + USAGE);
        }
        if (words.isEmpty()) fail(2, USAGE);

        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, timeout * 1000);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, timeout * 1000);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "kafka-admin");
        String command = words.get(0);
        int code;
        try (Admin admin = Admin.create(props)) {
            code = switch (command) {
                case "health" -> health(admin, timeout);
                case "list" -> list(admin, timeout);
                case "describe" -> describe(admin, one(words, "describe TOPIC"), timeout);
                case "create-topic" -> create(admin, one(words, "create-topic TOPIC"), partitions,
                        replication, configs, ifNotExists, timeout);
                default -> {
                    fail(2, "unknown command " + command + "\n" + USAGE);
                    yield 2;
                }
            };
        } catch (ExecutionException e) {
            Throwable cause = e.getCause() == null ? e : e.getCause();
            fail(1, "kafka-admin " + command + " (" + bootstrap + "): " + cause.getClass().getSimpleName() + ": " + cause.getMessage());
            return;
        } catch (Exception e) {
            fail(1, "kafka-admin " + command + " (" + bootstrap + "): " + e);
            return;
        }
        System.exit(code);
    }

    private static String one(List<String> words, String usage) {
        if (words.size() != 2) fail(2, "usage: kafka-admin " + usage);
        return words.get(1);
    }

    private static void fail(int code, String message) {
        System.err.println(message);
        System.exit(code);
    }

    private static Set<String> names(Admin admin, int timeout) throws Exception {
        return admin.listTopics(new ListTopicsOptions().listInternal(true)).names().get(timeout, TimeUnit.SECONDS);
    }

    /** The cluster answers its metadata, and every partition (internal topics too) has a leader. */
    private static int health(Admin admin, int timeout) throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        var nodes = cluster.nodes().get(timeout, TimeUnit.SECONDS);
        Node controller = cluster.controller().get(timeout, TimeUnit.SECONDS);
        String id = cluster.clusterId().get(timeout, TimeUnit.SECONDS);
        if (nodes.isEmpty()) {
            System.err.println("unhealthy: the cluster lists no broker");
            return 1;
        }
        Set<String> topics = names(admin, timeout);
        int leaderless = 0, count = 0;
        if (!topics.isEmpty()) {
            for (TopicDescription d : admin.describeTopics(topics).allTopicNames().get(timeout, TimeUnit.SECONDS).values()) {
                for (TopicPartitionInfo p : d.partitions()) {
                    count++;
                    if (p.leader() == null || p.leader().isEmpty()) {
                        leaderless++;
                        System.err.println("unhealthy: " + d.name() + "-" + p.partition() + " has no leader");
                    }
                }
            }
        }
        if (leaderless > 0) return 1;
        System.out.println("healthy: cluster " + id + ", " + nodes.size() + " broker(s), controller "
                + (controller == null ? "?" : controller.id()) + ", " + topics.size() + " topic(s), "
                + count + " partition(s), all led");
        return 0;
    }

    private static int list(Admin admin, int timeout) throws Exception {
        for (String name : new TreeSet<>(names(admin, timeout))) System.out.println(name);
        return 0;
    }

    private static int describe(Admin admin, String topic, int timeout) throws Exception {
        TopicDescription d = admin.describeTopics(Collections.singleton(topic)).allTopicNames()
                .get(timeout, TimeUnit.SECONDS).get(topic);
        System.out.println(d.name() + " partitions=" + d.partitions().size() + " id=" + d.topicId());
        for (TopicPartitionInfo p : d.partitions()) {
            System.out.println("  " + p.partition() + " leader=" + (p.leader() == null ? "none" : p.leader().id())
                    + " replicas=" + p.replicas().stream().map(Node::id).toList()
                    + " isr=" + p.isr().stream().map(Node::id).toList());
        }
        return 0;
    }

    private static int create(Admin admin, String topic, Integer partitions, Short replication,
            Map<String, String> configs, boolean ifNotExists, int timeout) throws Exception {
        NewTopic topicSpec = new NewTopic(topic, Optional.ofNullable(partitions), Optional.ofNullable(replication))
                .configs(configs);
        try {
            admin.createTopics(List.of(topicSpec), new CreateTopicsOptions().timeoutMs(timeout * 1000))
                    .all().get(timeout, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            if (ifNotExists && e.getCause() instanceof TopicExistsException) {
                System.out.println("exists: " + topic);
                return 0;
            }
            throw e;
        }
        System.out.println("created: " + topic);
        return 0;
    }
}
